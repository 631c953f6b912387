"""A task's status and results: `lookup(task_id, wait)` is the one way to ask (`fleet result` calls
it once). It answers from the cheapest place that can tell:

1. storage (`stored_result`, about a third of a second for the whole command, where loading a
   Dagster instance alone takes longer): when the task's stored decision was written by the run
   that also stored its task (the first asset of every run), that run is the task's latest
   started run and it has decided;
2. the instance's tables, read without loading Dagster (history/run_index.py), for a task that
   has not decided (`undecided_result`): PENDING, IN_PROGRESS or NOT_FOUND;
3. the Dagster instance (`task_result`), by index, never by listing partitions or runs: the
   task's latest run (run tag), the partition's latest decision (asset key + partition), the
   partition itself; then, when retention has removed the partition, the decision log table of
   the day the decision was stored; then the last approved plans in the stream. With `wait` or
   `follow` it is polled until a final status.

PENDING: the partition exists or the approved plan sits in the stream, no run started yet (or
queued); IN_PROGRESS: a run is going; COMPLETED / PARTIAL / FAILED / TIMEOUT: the decision's
status (FAILED also for a run that crashed before deciding); NOT_FOUND: nothing knows the task.
Dagster, pandas and NATS are imported only by the steps that need them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from ..domain.decision import Decision
from ..domain.workspace import PushedBranch
from ..names import (
    DECISION,
    DELIBERATION_ASSETS,
    DELIBERATION_JOB,
    DELIBERATION_PARTITIONS,
    DELIBERATION_TASK,
    PARTITION_TAG,
    TURN_LOG_PREFIX,
    WINNING_BRANCH,
)
from .stored import read_stored, read_stored_entry, stored_run_id

if TYPE_CHECKING:
    import dagster as dg
    import pandas as pd

    from ..events.options import ConnectOptions


class TaskStatus(StrEnum):
    PENDING = "PENDING"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    PARTIAL = "PARTIAL"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NOT_FOUND = "NOT_FOUND"


Source = Literal["live", "decision_log", "planning_stream", "none"]
TERMINAL = {TaskStatus.COMPLETED, TaskStatus.PARTIAL, TaskStatus.FAILED, TaskStatus.TIMEOUT}
# Dagster run statuses (DagsterRunStatus values) of a run that has not started its steps yet.
WAITING_RUN = {"QUEUED", "NOT_STARTED", "STARTING"}
GOING_RUN = "STARTED"
FAILED_RUN = {"FAILURE", "CANCELED"}


class TaskResult(BaseModel):
    task_id: str = Field(description="The task (partition key).")
    status: TaskStatus = Field(description="Where the task stands.")
    detail: str = Field(description="What the status is based on.")
    source: Source = Field(
        description="What answered: the live partition (its runs and stored values), the decision "
        "log (the partition was removed by retention), the planning stream, or nothing."
    )
    run_id: str | None = Field(default=None, description="Latest deliberation run of the task.")
    winner_id: str | None = Field(default=None, description="Winning agent.")
    ranking: list[dict] = Field(default_factory=list, description="Agents by score.")
    reasons: list[str] = Field(default_factory=list, description="Why this status and winner.")
    winner_content: str | None = Field(default=None, description="The winning proposal.")
    winner_patch: str | None = Field(default=None, description="A repository task: the winning unified diff.")
    pushed_branch: str | None = Field(
        default=None, description="A repository task: the branch the winning patch was pushed as."
    )
    events_pending: int = Field(
        default=0, description="Events of the run kept while NATS was unreachable, not yet published."
    )


def pushed_branch(base_path: str, task_id: str, run_id: str) -> str | None:
    """The branch `winning_branch` stored for the run (None: not pushed, or not by this run)."""
    stored = read_stored_entry(base_path, WINNING_BRANCH, task_id)
    if stored is None or stored[1] != run_id or not isinstance(stored[0], PushedBranch):
        return None
    return stored[0].branch or None


def from_decision(task_id: str, run_id: str, decision: Decision, branch: str | None = None) -> TaskResult:
    return TaskResult(
        task_id=task_id,
        status=TaskStatus(decision.status.value),
        detail=f"decision of run {run_id}",
        source="live",
        run_id=run_id,
        winner_id=decision.winner_id,
        ranking=[r.model_dump() for r in decision.ranking],
        reasons=decision.reasons,
        winner_content=decision.winner_content or None,
        winner_patch=decision.winner_patch or None,
        pushed_branch=branch,
    )


def stored_result(base_path: str, task_id: str) -> TaskResult | None:
    """The task's decision from storage when its latest started run stored it, else None."""
    decided = read_stored_entry(base_path, DECISION, task_id)
    if decided is None:
        return None
    decision, run_id = decided
    started = read_stored_entry(base_path, DELIBERATION_TASK, task_id)
    if run_id is None or started is None or started[1] != run_id or not isinstance(decision, Decision):
        return None
    return from_decision(task_id, run_id, decision, pushed_branch(base_path, task_id, run_id))


def undecided_result(
    base_path: str,
    task_id: str,
    latest_run: tuple[str, str] | None,
    partition_added: bool,
    find_in_stream: Callable[[str], int | None],
) -> TaskResult | None:
    """The answer for a task with no decision of its latest run: `latest_run` is (run id, Dagster
    run status) of the task's newest deliberation run, `partition_added` whether its partition
    exists, `find_in_stream(task_id)` the planning stream sequence of an approved plan not yet
    processed. PENDING (a run waiting to start, a partition with no run, a plan in the stream),
    IN_PROGRESS (a run going that has not stored its decision) or NOT_FOUND; None when the run has
    ended or has stored its decision: only the Dagster instance knows more (`task_result`)."""
    if latest_run is not None:
        run_id, status = latest_run
        if status in WAITING_RUN:
            return TaskResult(
                task_id=task_id,
                status=TaskStatus.PENDING,
                detail=f"run {run_id} {status}",
                source="live",
                run_id=run_id,
            )
        if status != GOING_RUN or stored_run_id(base_path, DECISION, task_id) == run_id:
            return None
        done = [asset for asset in DELIBERATION_ASSETS if stored_run_id(base_path, asset, task_id) == run_id]
        return TaskResult(
            task_id=task_id,
            status=TaskStatus.IN_PROGRESS,
            detail=f"run {run_id} {status}; stored: {', '.join(done) or 'nothing yet'}",
            source="live",
            run_id=run_id,
        )
    if partition_added:
        return TaskResult(
            task_id=task_id, status=TaskStatus.PENDING, detail="partition added, no run yet", source="live"
        )
    seq = find_in_stream(task_id)
    if seq is not None:
        return TaskResult(
            task_id=task_id,
            status=TaskStatus.PENDING,
            detail=f"approved plan accepted (planning stream seq {seq}), waiting for the planning sensor",
            source="planning_stream",
        )
    return TaskResult(
        task_id=task_id,
        status=TaskStatus.NOT_FOUND,
        detail="no run, partition or planning event",
        source="none",
    )


def _decided_at(instance: dg.DagsterInstance, task_id: str, run_id: str) -> float | None:
    """When `run_id` stored the task's decision (None: it has not): the partition's latest decision
    materialization, one indexed query (asset key + partition) however many runs and events exist."""
    import dagster as dg

    from .log import DECISION_KEY

    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=DECISION_KEY, asset_partitions=[task_id]), limit=1
    ).records
    return records[0].timestamp if records and records[0].run_id == run_id else None


def _from_log(task_id: str, run_id: str, day: str, table: pd.DataFrame | None) -> TaskResult:
    rows = [] if table is None else table[(table["task_id"] == task_id) & (table["run_id"] == run_id)]
    if len(rows) == 0:
        return TaskResult(
            task_id=task_id,
            status=TaskStatus.NOT_FOUND,
            detail=f"run {run_id} decided on {day}; its partition is gone and the decision log of "
            f"{day} has no row for it",
            source="none",
            run_id=run_id,
        )
    row = rows.iloc[-1]
    content = row["winner_content"]
    return TaskResult(
        task_id=task_id,
        status=TaskStatus(row["status"]),
        detail=f"decision of run {run_id}, from the decision log of {day} (partition removed by retention)",
        source="decision_log",
        run_id=run_id,
        winner_id=None if row.isna()["winner_id"] else row["winner_id"],
        ranking=json.loads(row["scores"]),
        reasons=json.loads(row["reasons"]),
        winner_content=None if row.isna()["winner_content"] else content or None,
    )


def task_result(
    instance: dg.DagsterInstance,
    base_path: str,
    task_id: str,
    find_in_stream: Callable[[str], int | None],
) -> TaskResult:
    """The task's status from the Dagster instance; `base_path` is the asset storage (the live
    decision, the decision log), `find_in_stream(task_id)` gives the stream sequence of a
    not-yet-processed approved plan naming the task, or None."""
    import dagster as dg

    from .log import day_of, read_log

    records = instance.get_run_records(
        dg.RunsFilter(job_name=DELIBERATION_JOB, tags={PARTITION_TAG: task_id}), limit=1
    )
    run = records[0].dagster_run if records else None
    live = instance.has_dynamic_partition(DELIBERATION_PARTITIONS, task_id)
    latest = (run.run_id, run.status.value) if run else None
    undecided = undecided_result(base_path, task_id, latest, live, find_in_stream)
    if undecided is not None:
        return undecided
    if run is None:
        raise AssertionError("undecided_result answers every task that has no run")
    decided_at = _decided_at(instance, task_id, run.run_id)
    if decided_at is not None:
        if live:
            decision = read_stored(base_path, DECISION, task_id)
            return from_decision(task_id, run.run_id, decision, pushed_branch(base_path, task_id, run.run_id))
        day = day_of(decided_at)
        return _from_log(task_id, run.run_id, day, read_log(base_path, day))
    if run.status.value in FAILED_RUN:
        failures = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        message = failures[-1].message if failures else f"run {run.status.value}"
        return TaskResult(
            task_id=task_id, status=TaskStatus.FAILED, detail=message, source="live", run_id=run.run_id
        )
    return TaskResult(
        task_id=task_id,
        status=TaskStatus.IN_PROGRESS,
        detail=f"run {run.run_id} {run.status.value}; no decision recorded yet",
        source="live",
        run_id=run.run_id,
    )


def finished_turns(
    instance: dg.DagsterInstance, run_id: str, cursor: str | None
) -> tuple[list[str], str | None]:
    """Run-log lines of the turns that finished in `run_id` after `cursor` (None: from the start),
    and the cursor to pass next time (`fleet result --follow`)."""
    connection = instance.get_records_for_run(run_id, cursor=cursor, limit=1_000)
    lines = [
        r.event_log_entry.user_message
        for r in connection.records
        if r.event_log_entry.user_message.startswith(TURN_LOG_PREFIX)
    ]
    return lines, connection.cursor or cursor


def stream_finder(nats: ConnectOptions) -> Callable[[str], int | None]:
    """`find_in_stream(task_id)`: the planning stream sequence of an approved plan naming the
    task, None when there is none or NATS is unreachable."""

    def find_in_stream(task_id: str) -> int | None:
        # Only when no run knows the task: NATS is not needed before.
        from ..events.bus import run_session
        from ..events.plan_lookup import find_task_in_stream
        from ..events.streams import NatsError

        try:
            return run_session(nats, lambda session: find_task_in_stream(session, task_id))
        except NatsError:
            return None

    return find_in_stream


def _quick_result(
    task_id: str, base_path: str, dagster_home: Path, find_in_stream: Callable[[str], int | None]
) -> TaskResult | None:
    """A task that has not decided, answered from the instance's tables without loading Dagster;
    None when only Dagster can tell."""
    from .run_index import RunIndexError, open_run_index

    try:
        index = open_run_index(dagster_home)
        if index is None:
            return None
        run = index.latest_run(task_id)
        latest = (run.run_id, run.status) if run else None
        partition_added = run is None and index.has_partition(task_id)
    except RunIndexError:
        return None
    return undecided_result(base_path, task_id, latest, partition_added, find_in_stream)


def _polled_result(
    task_id: str,
    wait: float,
    follow: Callable[[str], None] | None,
    base_path: str,
    dagster_home: Path,
    find_in_stream: Callable[[str], int | None],
) -> TaskResult:
    """The task's status from the Dagster instance, polled until final with `wait` / `follow`."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(dagster_home))
    deadline = time.monotonic() + (wait or (math.inf if follow else 0))
    followed: dict[str, str | None] = {}  # run id -> its log cursor
    while True:
        found = task_result(instance, base_path, task_id, find_in_stream)
        if follow and found.run_id and found.status is not TaskStatus.PENDING:
            lines, followed[found.run_id] = finished_turns(instance, found.run_id, followed.get(found.run_id))
            for line in lines:
                follow(line)
        unknown = found.status is TaskStatus.NOT_FOUND and not wait
        if found.status in TERMINAL or unknown or time.monotonic() >= deadline:
            break
        time.sleep(1)
    return found


def lookup(
    task_id: str,
    wait: float,
    *,
    storage: str,
    outbox: str,
    dagster_home: Path,
    nats: ConnectOptions,
    follow: Callable[[str], None] | None = None,
) -> TaskResult:
    """The task's status and results, with the events of its run still waiting in the outbox.

    `wait`: poll up to this many seconds for a final status. `follow`: called with each finished
    turn's run-log line as it comes, until a final status (`wait` limits it; 0: no limit).
    `storage` is the asset storage, `outbox` where runs keep the events NATS did not take,
    `dagster_home` the instance's home (holding its dagster.yaml), `nats` how to reach the
    planning stream."""
    find_in_stream = stream_finder(nats)
    found = None if follow else stored_result(storage, task_id)
    if found is None and not (follow or wait):  # not decided: the instance's tables may tell
        found = _quick_result(task_id, storage, dagster_home, find_in_stream)
    if found is None:  # decided by an older run, a run that ended, wait/follow: ask Dagster
        found = _polled_result(task_id, wait, follow, storage, dagster_home, find_in_stream)
    if found.run_id:
        from ..events.outbox import Outbox

        found = found.model_copy(update={"events_pending": Outbox(outbox).pending(found.run_id)})
    return found
