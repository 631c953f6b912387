"""Retention: deliberations decided longer ago than the retention age leave the dynamic partition
set, and their stored values go with them, but only once their decision is in the decision log.

The oldest partitions come first (the partition table's own order), a page at a time; the walk
stops at the first page with nothing old enough, so a run costs what it removes, not what is kept.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import dagster as dg
from pydantic import BaseModel, Field

from ..dagster_private import delete_dynamic_partitions
from .log import DECISION_KEY, day_of, latest_decision_ids, read_log
from .stored import stored_path

PAGE = 500


class RetentionReport(BaseModel):
    cutoff: float = Field(description="Deliberations decided before this time (epoch s) expire.")
    removed: list[str] = Field(default_factory=list, description="Task ids removed, oldest first.")
    removed_by_day: dict[str, int] = Field(default_factory=dict, description="Removed, per decision day.")
    files_removed: int = Field(default=0, description="Stored asset values deleted.")
    workspaces_removed: int = Field(default=0, description="Repository tasks' workspace folders deleted.")
    not_logged: list[str] = Field(
        default_factory=list, description="Expired but not in the decision log yet: kept for a later run."
    )
    undecided: int = Field(
        default=0, description="Partitions seen with no decision (never run or crashed): kept."
    )
    examined: int = Field(default=0, description="Partitions looked at.")

    def summary(self) -> str:
        cutoff = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.cutoff))
        return (
            f"removed {len(self.removed)} deliberations decided before {cutoff} UTC "
            f"({self.files_removed} files, {self.workspaces_removed} workspaces); "
            f"kept {len(self.not_logged)} not yet in the decision log and {self.undecided} undecided; "
            f"examined {self.examined}"
        )


def _logged(base_path: str, day: str) -> set[tuple[str, str]]:
    table = read_log(base_path, day)
    return set() if table is None else set(zip(table["task_id"], table["run_id"], strict=True))


def _delete(path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def expire(
    instance: dg.DagsterInstance,
    base_path: str,
    partitions_def_name: str,
    assets: list[str],
    max_age_s: float,
    now: float | None = None,
    remove_workspace: Callable[[str], bool] | None = None,
) -> RetentionReport:
    """Removes the partitions (and the stored values of `assets`, and with `remove_workspace` a
    repository task's workspace) whose latest decision is older than `max_age_s` and whose row
    (task id, run id) is in that day's decision log."""
    report = RetentionReport(cutoff=(now if now is not None else time.time()) - max_age_s)
    logs: dict[str, set[tuple[str, str]]] = {}
    by_day: Counter[str] = Counter()
    cursor = None
    while True:
        page = instance.get_paginated_dynamic_partitions(
            partitions_def_name, limit=PAGE, ascending=True, cursor=cursor
        )
        keys = list(page.results)
        report.examined += len(keys)
        latest = latest_decision_ids(instance, keys)
        records = (
            {
                r.partition_key: r
                for r in instance.fetch_materializations(
                    dg.AssetRecordsFilter(asset_key=DECISION_KEY, storage_ids=list(latest.values())),
                    limit=len(latest),
                ).records
            }
            if latest
            else {}
        )
        expired = newer = 0
        removable: list[str] = []
        for key in keys:
            record = records.get(key)
            if record is None:
                report.undecided += 1
                continue
            if record.timestamp >= report.cutoff:
                newer += 1
                continue
            expired += 1
            day = day_of(record.timestamp)
            if day not in logs:
                logs[day] = _logged(base_path, day)
            if (key, record.run_id) not in logs[day]:
                report.not_logged.append(key)
                continue
            for asset in assets:  # files first: a crash in between leaves no orphan file
                report.files_removed += _delete(stored_path(base_path, asset, key))
            if remove_workspace is not None:
                report.workspaces_removed += remove_workspace(key)
            removable.append(key)
            by_day[day] += 1
        delete_dynamic_partitions(instance, partitions_def_name, removable)
        report.removed.extend(removable)
        if not page.has_more or (newer and not expired):
            break
        cursor = page.cursor
    report.removed_by_day = dict(sorted(by_day.items()))
    return report
