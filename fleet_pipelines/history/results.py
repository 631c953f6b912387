"""A task's status and results, read back from the Dagster instance (`fleet result`).

Lookups go by index, never by listing partitions or runs: the task's latest run (run tag), the
partition's latest decision (asset key + partition), the partition itself; then, when retention
has removed the partition, the decision log table of the day the decision was stored; then the
last approved plans in the stream.

PENDING: the partition exists or the approved plan sits in the stream, no run started yet (or
queued); IN_PROGRESS: a run is going; COMPLETED / PARTIAL / FAILED / TIMEOUT: the decision's
status (FAILED also for a run that crashed before deciding); NOT_FOUND: nothing knows the task.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import dagster as dg

from ..domain.decision import Decision
from ..names import DELIBERATION_JOB, DELIBERATION_PARTITIONS, PARTITION_TAG, TURN_LOG_PREFIX
from .log import DECISION_KEY, day_of
from .task_result import TaskResult, TaskStatus, from_decision, pushed_branch, undecided_result

if TYPE_CHECKING:
    import pandas as pd

_FAILED = {dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def _decided_at(instance: dg.DagsterInstance, task_id: str, run_id: str) -> float | None:
    """When `run_id` stored the task's decision (None: it has not): the partition's latest decision
    materialization, one indexed query (asset key + partition) however many runs and events exist."""
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
    load_decision: Callable[[str], Decision],
    load_log_day: Callable[[str], pd.DataFrame | None],
    find_in_stream: Callable[[str], int | None],
) -> TaskResult:
    """`base_path` is the asset storage; `load_decision(task_id)` reads the live decision asset;
    `load_log_day(day)` one day of the decision log (None if not built); `find_in_stream(task_id)`
    gives the stream sequence of a not-yet-processed approved plan naming the task, or None."""
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
            branch = pushed_branch(base_path, task_id, run.run_id)
            return from_decision(task_id, run.run_id, load_decision(task_id), branch)
        day = day_of(decided_at)
        return _from_log(task_id, run.run_id, day, load_log_day(day))
    if run.status in _FAILED:
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
