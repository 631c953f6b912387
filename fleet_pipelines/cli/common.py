"""What several verbs share: exit codes, the Dagster home, and the task options of `run` and
`deliberate` (the domain Task's flat form on the command line)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import click

EXIT_USAGE = 2
REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def echo_decision(
    winner_id: str | None, ranking: list[dict], reasons: list[str], winner_content: str | None
) -> None:
    """The human form of a decision: winner, ranking, reasons and the winning proposal."""
    if winner_id:
        click.echo(f"winner: {winner_id}")
    for r in ranking:
        click.echo(f"  {r['rank']}. {r['agent_id']}  score {r['score']:.3f}")
    for reason in reasons:
        click.echo(f"  - {reason}")
    if winner_content:
        click.echo(f"\n--- winning proposal ---\n{winner_content}")


def dagster_home() -> Path:
    """DAGSTER_HOME, or `.fleet/dagster_home` seeded with the repo's dagster.yaml; exported."""
    from ..settings import FleetSettings

    home = FleetSettings.from_env().dagster_home_path()
    home.mkdir(parents=True, exist_ok=True)
    template = REPO_ROOT / "dagster.yaml"
    if not (home / "dagster.yaml").exists() and template.exists():
        shutil.copy(template, home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def _example(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[dict[str, str]]:
    examples = []
    for value in values:
        call, sep, expected = value.partition("=>")
        if not sep or not call.strip() or not expected.strip():
            raise click.BadParameter(f"{value!r}: expected 'CALL => EXPECTED', e.g. 'add(2, 3) => 5'")
        examples.append({"call": call.strip(), "expected": expected.strip()})
    return examples


def task_options(command: Callable) -> Callable:
    """The task's fields as arguments, with the domain Task's defaults and descriptions; the
    values are checked by the Task itself when the verb builds it."""
    from ..domain.models import Constraints, RepoSpec, Role, Task

    task, constraints, repo = Task.model_fields, Constraints.model_fields, RepoSpec.model_fields

    def field(info, **kwargs) -> dict:
        return {"default": info.default, "show_default": True, "help": info.description, **kwargs}

    options = [
        click.argument("description"),
        click.option(
            "--role",
            type=click.Choice([r.value for r in Role], case_sensitive=False),
            default=Role.DEV.value,
            show_default=True,
            help=task["role"].description,
        ),
        click.option("--agents", type=int, **field(task["num_agents"])),
        click.option("--rounds", type=int, **field(task["rounds"])),
        click.option("--rubric", **field(constraints["rubric"])),
        click.option(
            "--requirement", multiple=True, help="A requirement each proposal must meet; repeatable."
        ),
        click.option(
            "--timeout",
            type=float,
            default=None,
            help=constraints["timeout_seconds"].description
            + " Default: the code location's DELIBERATION_TIMEOUT (300).",
        ),
        click.option(
            "--tests",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help="A Python file: " + constraints["tests"].description,
        ),
        click.option(
            "--example",
            multiple=True,
            callback=_example,
            help="'CALL => EXPECTED', e.g. 'add(2, 3) => 5'; repeatable.",
        ),
        click.option("--task-id", help=task["task_id"].description + " Default: generated."),
        click.option("--repo", "repo_url", help="A repository task: " + repo["url"].description),
        click.option("--ref", help=repo["ref"].description + " Default: HEAD (with --repo)."),
        click.option(
            "--test-command",
            help=repo["test_command"].description + f" Default: {repo['test_command'].default}.",
        ),
        click.option("--subdir", help=repo["subdir"].description),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def task_fields(options: dict) -> tuple[str, dict]:
    """The task id (generated unless given) and the task's flat fields from the task options."""
    role = options["role"].upper()
    task_id = options["task_id"] or f"task-{role.lower()}-{uuid.uuid4().hex[:10]}"
    tests: Path | None = options["tests"]
    # Without --timeout the task gives no deadline: the code location's default applies.
    timeout = {} if options["timeout"] is None else {"timeout_seconds": options["timeout"]}
    return task_id, {
        "description": options["description"],
        "role": role,
        "num_agents": options["agents"],
        "rounds": options["rounds"],
        "rubric": options["rubric"],
        "requirements": list(options["requirement"]),
        **timeout,
        "tests": tests.read_text() if tests else "",
        "examples": options["example"],
        **_repo_field(options),
    }


def _repo_field(options: dict) -> dict:
    """`repo` from --repo/--ref/--test-command/--subdir (a local path made absolute: the run's
    process may start elsewhere)."""
    given = {k: options.get(k) for k in ("ref", "test_command", "subdir") if options.get(k)}
    if not options.get("repo_url"):
        if given:
            raise click.UsageError(f"--{next(iter(given)).replace('_', '-')} needs --repo")
        return {}
    url = options["repo_url"]
    if "://" not in url and Path(url).exists():
        url = str(Path(url).resolve())
    return {"repo": {"url": url, **given}}
