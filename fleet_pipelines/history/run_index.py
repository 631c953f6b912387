"""A task's latest run and its partition, read straight from the Dagster instance's tables.

`fleet result` on a task that has not decided needs two facts: the status of the task's latest
deliberation run, and whether the task's partition exists. Asking a Dagster instance takes over a
second (importing Dagster and building the instance); the same facts are two indexed queries on
tables Dagster owns: `runs` joined with `run_tags` (run storage: the run's partition tag, newest
run first as Dagster orders them) and `dynamic_partitions` (event log storage). They are read
with the standard library's sqlite3 or with psycopg2 (dagster-postgres's own driver).

Only the storages whose tables this knows are read: Dagster's default SQLite under DAGSTER_HOME,
`storage: sqlite` with a `base_dir`, and `storage: postgres` (`postgres_url` or `postgres_db`,
values or `env:`). Any other instance (a custom storage class, MySQL), or a table that does not
read as expected (a Dagster upgrade changed it), gives None or `RunIndexError`, and the caller
asks Dagster instead. tests/integration/test_run_index.py checks the answers against a real
instance's own, on both storages, for runs in every status.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..names import DELIBERATION_JOB, DELIBERATION_PARTITIONS, PARTITION_TAG

# `{p}` is the driver's placeholder: `?` (sqlite3) or `%s` (psycopg2).
_LATEST_RUN = (
    "SELECT runs.run_id, runs.status FROM runs JOIN run_tags ON run_tags.run_id = runs.run_id "
    "WHERE runs.pipeline_name = {p} AND run_tags.key = {p} AND run_tags.value = {p} "
    "ORDER BY runs.id DESC LIMIT 1"
)
_PARTITION = "SELECT 1 FROM dynamic_partitions WHERE partitions_def_name = {p} AND partition = {p} LIMIT 1"


class RunIndexError(Exception):
    """The instance's tables could not be read as expected: ask Dagster instead."""


@dataclass(frozen=True)
class LatestRun:
    run_id: str
    status: str  # a DagsterRunStatus value: QUEUED, STARTED, SUCCESS, ...


Query = Callable[[str, tuple[str, ...]], list[tuple[Any, ...]]]


@dataclass(frozen=True)
class RunIndex:
    """Reads of one instance's tables: `runs_query` on its run storage, `events_query` on its
    event log storage (the same database on PostgreSQL, two files on SQLite)."""

    runs_query: Query
    events_query: Query

    def latest_run(self, task_id: str) -> LatestRun | None:
        """The task's newest deliberation run (what `get_run_records(RunsFilter(job_name, tags),
        limit=1)` returns), or None."""
        rows = self.runs_query(_LATEST_RUN, (DELIBERATION_JOB, PARTITION_TAG, task_id))
        return LatestRun(run_id=str(rows[0][0]), status=str(rows[0][1])) if rows else None

    def has_partition(self, task_id: str) -> bool:
        """Whether the task's partition exists (`has_dynamic_partition`)."""
        return bool(self.events_query(_PARTITION, (DELIBERATION_PARTITIONS, task_id)))


def _value(value: Any) -> Any:
    """A config value as Dagster's `StringSource`/`IntSource` reads it: itself or `{env: NAME}`."""
    if isinstance(value, dict) and set(value) == {"env"}:
        name = value["env"]
        if name not in os.environ:
            raise RunIndexError(f"dagster.yaml reads {name} from the environment, which is not set")
        return os.environ[name]
    return value


def _sqlite_query(path: Path) -> Query:
    def query(sql: str, params: tuple[str, ...]) -> list[tuple[Any, ...]]:
        if not path.exists():  # Dagster creates it on first use: nothing stored yet
            return []
        try:
            with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=5)) as conn:
                return conn.execute(sql.format(p="?"), params).fetchall()
        except sqlite3.Error as exc:
            raise RunIndexError(f"{path}: {exc}") from exc

    return query


def _postgres_query(config: dict) -> Query:
    if "postgres_url" in config:
        # psycopg2 (libpq) takes a plain URL; SQLAlchemy's `+driver` suffix is not part of it.
        url = str(_value(config["postgres_url"]))
        scheme, sep, rest = url.partition("://")
        connect_args: dict[str, Any] = {"dsn": f"{scheme.split('+')[0]}{sep}{rest}"}
    else:
        db = config.get("postgres_db") or {}
        connect_args = {
            "host": _value(db.get("hostname")),
            "user": _value(db.get("username")),
            "password": _value(db.get("password")),
            "dbname": _value(db.get("db_name")),
            "port": int(_value(db.get("port", 5432))),
            **{k: _value(v) for k, v in (db.get("params") or {}).items()},
        }

    def query(sql: str, params: tuple[str, ...]) -> list[tuple[Any, ...]]:
        import psycopg2

        try:
            conn = psycopg2.connect(connect_timeout=5, **connect_args)
        except psycopg2.Error as exc:
            raise RunIndexError(f"PostgreSQL: {exc}".strip()) from exc
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql.format(p="%s"), params)
                return cursor.fetchall()
        except psycopg2.Error as exc:
            raise RunIndexError(f"PostgreSQL: {exc}".strip()) from exc
        finally:
            conn.close()

    return query


def open_run_index(dagster_home: Path) -> RunIndex | None:
    """The instance of `dagster_home` (its dagster.yaml) as a `RunIndex`; None for a storage this
    does not read (then ask Dagster)."""
    config_file = dagster_home / "dagster.yaml"
    try:
        config = (yaml.safe_load(config_file.read_text()) if config_file.exists() else None) or {}
    except yaml.YAMLError as exc:
        raise RunIndexError(f"{config_file}: {exc}") from exc
    if not isinstance(config, dict) or {"run_storage", "event_log_storage", "instance_class"} & set(config):
        return None
    storage = config.get("storage")
    if storage is None:
        base = dagster_home
    elif isinstance(storage, dict) and set(storage) == {"sqlite"}:
        base = Path(str(_value((storage["sqlite"] or {}).get("base_dir", str(dagster_home)))))
    elif isinstance(storage, dict) and set(storage) == {"postgres"} and isinstance(storage["postgres"], dict):
        query = _postgres_query(storage["postgres"])
        return RunIndex(runs_query=query, events_query=query)
    else:
        return None
    # DagsterSqliteStorage's layout: <base>/history/runs.db, <base>/history/runs/index.db.
    return RunIndex(
        runs_query=_sqlite_query(base / "history" / "runs.db"),
        events_query=_sqlite_query(base / "history" / "runs" / "index.db"),
    )
