"""`fleet result`: a task's status and results (history/status.py looks them up)."""

from __future__ import annotations

import sys

import click

from .common import dagster_home, echo_decision

EXIT_RESULT = {
    "COMPLETED": 0,
    "PARTIAL": 0,
    "PENDING": 0,
    "IN_PROGRESS": 0,
    "FAILED": 1,
    "TIMEOUT": 1,
    "NOT_FOUND": 3,
}
EXIT_WAIT_EXPIRED = 4


@click.command(
    help="A task's status (PENDING, IN_PROGRESS, COMPLETED, PARTIAL, FAILED, TIMEOUT, NOT_FOUND). "
    "Exit codes: 0 COMPLETED/PARTIAL/PENDING/IN_PROGRESS, 1 FAILED/TIMEOUT, 3 NOT_FOUND, "
    "4 --wait expired before a final status."
)
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@click.option("--wait", type=float, default=0.0, help="poll up to SECONDS for a final status")
@click.option(
    "--follow",
    is_flag=True,
    help="print each turn (queue wait, service time) and each tool call (tool, arguments, outcome, "
    "time) as it finishes, until a final status (--wait limits it)",
)
@click.option(
    "--patch",
    "patch_only",
    is_flag=True,
    help="a repository task: write only the winning patch (a unified diff) to stdout, e.g. > fix.diff",
)
def result(task_id: str, as_json: bool, wait: float, follow: bool, patch_only: bool) -> None:
    from ..history.status import TERMINAL, lookup
    from ..settings import FleetSettings

    settings = FleetSettings.from_env()
    found = lookup(
        task_id,
        wait,
        storage=settings.storage,
        outbox=settings.outbox,
        dagster_home=dagster_home(),
        nats=settings.nats_options(),
        follow=(lambda line: click.echo(line.removeprefix("turn "))) if follow else None,
    )
    if patch_only:
        if not found.winner_patch:
            click.echo(f"fleet result: task {task_id} ({found.status.value}) has no winning patch", err=True)
            sys.exit(EXIT_RESULT[found.status.value] or 1)
        click.echo(found.winner_patch, nl=False)
    elif as_json:
        click.echo(found.model_dump_json(indent=2))
    else:
        click.echo(f"task {found.task_id}: {found.status.value} (from {found.source})\n  {found.detail}")
        if found.events_pending:
            click.echo(f"  {found.events_pending} events pending: NATS was unreachable; sent when it is back")
        echo_decision(found.winner_id, found.ranking, found.reasons, found.winner_content)
        if found.winner_patch:
            pushed = f", pushed as {found.pushed_branch}" if found.pushed_branch else ""
            click.echo(f"\nwinning patch{pushed}: `fleet result {task_id} --patch > fix.diff`")
    if (wait or follow) and found.status not in TERMINAL and found.status.value != "NOT_FOUND":
        sys.exit(EXIT_WAIT_EXPIRED)
    sys.exit(EXIT_RESULT[found.status.value])
