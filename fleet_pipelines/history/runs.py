"""When runs started and ended, from the Dagster instance (indexed lookups by run id)."""

from __future__ import annotations

import dagster as dg


def run_times(instance: dg.DagsterInstance, run_id: str) -> tuple[float | None, float | None]:
    """(start, end) of a run as time.time() values; None for what has not happened (or is unknown)."""
    record = instance.get_run_record_by_id(run_id)
    if record is None:
        return None, None
    return record.start_time or None, record.end_time or None


def run_started(instance: dg.DagsterInstance, run_id: str) -> float | None:
    return run_times(instance, run_id)[0]


def start_times(instance: dg.DagsterInstance, run_ids: list[str], page: int) -> dict[str, float | None]:
    """When each of many runs started, a page of runs per query."""
    starts: dict[str, float | None] = {}
    for i in range(0, len(run_ids), page):
        for record in instance.get_run_records(dg.RunsFilter(run_ids=run_ids[i : i + page])):
            starts[record.dagster_run.run_id] = record.start_time
    return starts
