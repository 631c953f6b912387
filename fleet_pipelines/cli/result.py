"""`fleet result`: a task's status and results (history/results.py looks them up)."""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING

import click

from .common import dagster_home, echo_decision

if TYPE_CHECKING:
    from ..history.task_result import TaskResult
    from ..settings import FleetSettings

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
    from ..history.task_result import TERMINAL, stored_result
    from ..settings import FleetSettings

    settings = FleetSettings.from_env()
    found = None if follow else stored_result(settings.storage, task_id)
    if found is None and not (follow or wait):  # not decided: the instance's tables may tell
        found = _quick_lookup(task_id, settings)
    if found is None:  # decided by an older run, a run that ended, --wait/--follow: ask Dagster
        found = _lookup(task_id, wait, follow, settings)
    if found.run_id:
        from ..events.outbox import Outbox

        found = found.model_copy(update={"events_pending": Outbox(settings.outbox).pending(found.run_id)})
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


def _stream_finder(settings: FleetSettings):
    """`find_in_stream(task_id)`: the planning stream sequence of an approved plan naming the
    task, None when there is none or NATS is unreachable."""

    def find_in_stream(task_id: str) -> int | None:
        # Only when no run knows the task: NATS is not needed before.
        from ..events.bus import run_session
        from ..events.plan_lookup import find_task_in_stream
        from ..events.streams import NatsError

        try:
            return run_session(settings.nats_options(), lambda session: find_task_in_stream(session, task_id))
        except NatsError:
            return None

    return find_in_stream


def _quick_lookup(task_id: str, settings: FleetSettings) -> TaskResult | None:
    """A task that has not decided, answered from the instance's tables without loading Dagster
    (history/run_index.py); None when only Dagster can tell."""
    from ..history.run_index import RunIndexError, open_run_index
    from ..history.task_result import undecided_result

    try:
        index = open_run_index(dagster_home())
        if index is None:
            return None
        run = index.latest_run(task_id)
        latest = (run.run_id, run.status) if run else None
        partition_added = run is None and index.has_partition(task_id)
    except RunIndexError:
        return None
    return undecided_result(settings.storage, task_id, latest, partition_added, _stream_finder(settings))


def _lookup(task_id: str, wait: float, follow: bool, settings: FleetSettings) -> TaskResult:
    """The task's status from the Dagster instance, polled until final with --wait/--follow."""
    import dagster as dg

    from ..history.log import read_log
    from ..history.results import finished_turns, task_result
    from ..history.stored import read_stored
    from ..history.task_result import TERMINAL, TaskStatus

    dagster_home()
    find_in_stream = _stream_finder(settings)

    def load_decision(task_id: str):
        return read_stored(settings.storage, "decision", task_id)

    def load_log_day(day: str):
        return read_log(settings.storage, day)

    instance = dg.DagsterInstance.get()
    deadline = time.monotonic() + (wait or (math.inf if follow else 0))
    followed: dict[str, str | None] = {}  # run id -> its log cursor
    while True:
        found = task_result(instance, settings.storage, task_id, load_decision, load_log_day, find_in_stream)
        if follow and found.run_id and found.status is not TaskStatus.PENDING:
            lines, followed[found.run_id] = finished_turns(instance, found.run_id, followed.get(found.run_id))
            for line in lines:
                click.echo(line.removeprefix("turn "))
        unknown = found.status is TaskStatus.NOT_FOUND and not wait
        if found.status in TERMINAL or unknown or time.monotonic() >= deadline:
            break
        time.sleep(1)
    return found
