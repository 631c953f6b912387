"""`fleet councils list|show|validate`: the councils that would run, per role, and where each of
their values comes from: the councils file (FLEET_COUNCILS_FILE or --file) or, for what it does
not set, the council resource (FLEET_MAX_TOKENS, the built-in defaults). Without a file, the
built-in councils."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from ..settings import FleetSettings

if TYPE_CHECKING:
    from ..domain.councils import Convened, CouncilsFile
    from ..domain.models import Role

FILE_HELP = "The councils file (default FLEET_COUNCILS_FILE; none: the built-in councils)."


def _load(path: str | None) -> tuple[FleetSettings, str | None, CouncilsFile | None]:
    from ..domain.councils import CouncilsFileError
    from ..resources.council import read_councils

    settings = FleetSettings.from_env()
    path = path or settings.councils_file
    if not path:
        return settings, None, None
    try:
        return settings, path, read_councils(path)
    except CouncilsFileError as exc:
        click.echo(f"invalid: {exc}", err=True)
        raise SystemExit(2) from exc


def _convened(settings: FleetSettings, path: str | None, role: Role) -> Convened:
    """The council a task of `role` gets (the default council size)."""
    from .. import wiring
    from ..domain.models import Task

    task = Task(task_id=f"council-{role.value.lower()}", description="(the council shown)", role=role)
    return wiring.council(settings, councils_file=path).convene(task)


def _sources(settings: FleetSettings, loaded: CouncilsFile | None, role: Role) -> dict[str, str]:
    """Where the role's values come from: the file's names, then the resource's for the rest."""
    given = loaded.council(role).given() if loaded is not None and role in loaded.councils else []
    rest = "FLEET_MAX_TOKENS and the built-in defaults" if settings.max_tokens else "the built-in defaults"
    return {"councils file": ", ".join(given) or "nothing", "council resource": f"the rest ({rest})"}


def _header(path: str | None, loaded: CouncilsFile | None) -> str:
    if loaded is None:
        return "no councils file (FLEET_COUNCILS_FILE): the built-in councils"
    return f"{path} version {loaded.version}"


@click.group()
def councils() -> None:
    """The council of each role, as it would run."""


@councils.command("list")
@click.option("--file", "path", help=FILE_HELP)
def list_(path: str | None) -> None:
    """Every role: engine, agents, token budgets, judge budget, and where each value comes from."""
    from ..domain.models import Role

    settings, path, loaded = _load(path)
    click.echo(_header(path, loaded))
    for role in Role:
        convened = _convened(settings, path, role)
        engine = convened.engine
        name = loaded.council(role).engine if loaded is not None else None
        where = f"{name} ({engine.model} at {engine.base_url})" if engine else "the stack's engine"
        temperatures = ", ".join(f"{a.temperature:g}{'*' if a.diversity else ''}" for a in convened.agents)
        summary = convened.summary()
        budgets = ", ".join(f"{kind} {tokens}" for kind, tokens in summary["budgets"].items())
        sources = "; ".join(f"{k}: {v}" for k, v in _sources(settings, loaded, role).items())
        click.echo(
            f"{role.value:<10} engine {where}; agents [{temperatures}]; budgets {budgets}; "
            f"judge {convened.judge_max_tokens}\n{'':<10} from {sources}"
        )


@councils.command()
@click.argument("role")
@click.option("--file", "path", help=FILE_HELP)
def show(role: str, path: str | None) -> None:
    """The council a task of ROLE gets, in full, as JSON, with where its values come from."""
    from ..domain.models import Role

    try:
        wanted = Role(role.upper())
    except ValueError as exc:
        raise click.BadParameter(f"{role!r} is not one of {', '.join(r.value for r in Role)}") from exc
    settings, path, loaded = _load(path)
    convened = _convened(settings, path, wanted)
    summary = convened.summary()
    if convened.engine is not None and loaded is not None:
        summary["engine"] = {"name": loaded.council(wanted).engine, **convened.engine.model_dump()}
    shown = {
        "file": path,
        "version": convened.version,
        "configured": loaded is not None and wanted in loaded.councils,
        **summary,
        "sources": _sources(settings, loaded, wanted),
    }
    click.echo(json.dumps(shown, indent=2))


@councils.command()
@click.option("--file", "path", help=FILE_HELP)
def validate(path: str | None) -> None:
    """Exit 0 with a summary when the file is valid; 2 with every invalid field named."""
    _, path, loaded = _load(path)
    if loaded is None:
        click.echo("no councils file: pass --file or set FLEET_COUNCILS_FILE", err=True)
        raise SystemExit(2)
    click.echo(
        f"{path}: valid, version {loaded.version}, {len(loaded.councils)} council(s), "
        f"{len(loaded.engines)} engine(s)"
    )
