"""The decision log: every deliberation's outcome, one table per UTC day.

A row per decision materialization (a run of a task that reached the decision asset), on the day
the decision was stored. Built without listing partitions or runs: the day's decision events come
from the event log by asset key and time, each carrying its outcome as metadata (`OUTCOME`); the
run records give start times; the winning proposal is read from the task's stored decision when
that is still this run's (a task decided again later keeps the newer decision in its file).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import dagster as dg

from ..domain.decision import Decision
from ..domain.models import Task, TurnResult
from ..names import DECISION, DECISION_LOG
from .runs import start_times
from .stored import read_frame, read_stored, stored_path

if TYPE_CHECKING:  # pandas loads when a table is built or read, not with `fleet result`
    import pandas as pd

DECISION_KEY = dg.AssetKey(DECISION)
OUTCOME = "outcome"  # metadata entry of each decision materialization
DAY_FORMAT = "%Y-%m-%d"
PAGE = 1_000

LOG_COLUMNS = {
    "task_id": "string",
    "story_id": "string",
    "plan_id": "string",
    "role": "string",
    "status": "string",
    "winner_id": "string",
    "scores": "string",  # JSON [{rank, agent_id, score}], best first
    "reasons": "string",  # JSON [str]
    "tokens_in": "int64",
    "tokens_out": "int64",
    "turns": "int64",
    "failed_turns": "int64",
    "started_at": "datetime64[us, UTC]",
    "decided_at": "datetime64[us, UTC]",
    "duration_s": "float64",
    "run_id": "string",
    "winner_content": "string",  # null when a later run of the task replaced it
}


def outcome_metadata(task: Task, decision: Decision, turns: list[TurnResult]) -> dg.MetadataValue:
    """What the decision log keeps of a deliberation, stored with the decision's materialization."""
    return dg.MetadataValue.json(
        {
            "story_id": task.story_id,
            "plan_id": task.plan_id,
            "role": task.role.value,
            "status": decision.status.value,
            "winner_id": decision.winner_id,
            "scores": [r.model_dump() for r in decision.ranking],
            "reasons": decision.reasons,
            "tokens_in": sum(t.tokens_in for t in turns),
            "tokens_out": sum(t.tokens_out for t in turns),
            "turns": len(turns),
            "failed_turns": sum(not t.ok for t in turns),
        }
    )


def day_of(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime(DAY_FORMAT)


def day_window(day: str) -> tuple[float, float]:
    start = datetime.strptime(day, DAY_FORMAT).replace(tzinfo=UTC)
    return start.timestamp(), (start + timedelta(days=1)).timestamp()


def decision_records(instance: dg.DagsterInstance, day: str) -> list[dg.EventLogRecord]:
    """The decision materializations stored on `day` (UTC), oldest first, page by page."""
    start, end = day_window(day)
    # after_timestamp is exclusive; a decision stored exactly at midnight belongs to this day
    records_filter = dg.AssetRecordsFilter(
        asset_key=DECISION_KEY, after_timestamp=start - 1e-6, before_timestamp=end
    )
    records: list[dg.EventLogRecord] = []
    cursor = None
    while True:
        page = instance.fetch_materializations(records_filter, limit=PAGE, cursor=cursor, ascending=True)
        records.extend(page.records)
        if not page.has_more:
            return records
        cursor = page.cursor


def latest_decision_ids(instance: dg.DagsterInstance, task_ids: list[str]) -> dict[str, int]:
    """Storage id of each task's latest decision materialization (one indexed query per page)."""
    latest: dict[str, int] = {}
    for i in range(0, len(task_ids), PAGE):
        latest.update(
            instance.event_log_storage.get_latest_storage_id_by_partition(
                DECISION_KEY, dg.DagsterEventType.ASSET_MATERIALIZATION, set(task_ids[i : i + PAGE])
            )
        )
    return latest


def _utc(timestamp: float | None) -> pd.Timestamp | None:
    import pandas as pd

    return pd.Timestamp(timestamp, unit="s", tz="UTC") if timestamp else None


def _winner_content(base_path: str, task_id: str) -> str | None:
    if not stored_path(base_path, DECISION, task_id).exists():
        return None
    stored = read_stored(base_path, DECISION, task_id)
    return stored.winner_content or None if isinstance(stored, Decision) else None


def build_day(instance: dg.DagsterInstance, base_path: str, day: str) -> pd.DataFrame:
    """The decision log table of one UTC day, one row per decision stored that day."""
    import pandas as pd

    records = [r for r in decision_records(instance, day) if r.partition_key]
    latest = latest_decision_ids(instance, sorted({r.partition_key for r in records}))
    starts = start_times(instance, sorted({r.run_id for r in records}), PAGE)
    rows = []
    for record in records:
        materialization = record.asset_materialization
        entry = materialization.metadata.get(OUTCOME) if materialization else None
        if entry is None:  # stored before decisions carried their outcome
            continue
        outcome = entry.value
        task_id = record.partition_key
        started = starts.get(record.run_id)
        current = latest.get(task_id) == record.storage_id
        rows.append(
            {
                "task_id": task_id,
                "story_id": outcome["story_id"],
                "plan_id": outcome["plan_id"],
                "role": outcome["role"],
                "status": outcome["status"],
                "winner_id": outcome["winner_id"],
                "scores": json.dumps(outcome["scores"]),
                "reasons": json.dumps(outcome["reasons"]),
                "tokens_in": outcome["tokens_in"],
                "tokens_out": outcome["tokens_out"],
                "turns": outcome["turns"],
                "failed_turns": outcome["failed_turns"],
                "started_at": _utc(started),
                "decided_at": _utc(record.timestamp),
                "duration_s": record.timestamp - started if started else None,
                "run_id": record.run_id,
                "winner_content": _winner_content(base_path, task_id) if current else None,
            }
        )
    return pd.DataFrame(rows, columns=list(LOG_COLUMNS)).astype(LOG_COLUMNS)


def read_log(base_path: str, day: str) -> pd.DataFrame | None:
    """One day of the decision log as stored by its asset (None before it is built)."""
    return read_frame(base_path, DECISION_LOG, day)
