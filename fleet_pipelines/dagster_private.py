"""Every use of Dagster's private APIs (`dagster._…`), in one place.

They are bound to the Dagster release pinned in pyproject.toml (the one place its version is
named) and may change in any patch release. `tests/unit/test_dagster_private.py` checks each of
them against the installed Dagster and fails naming what changed, so an upgrade that breaks one
says so before anything runs on it:

- `delete_dynamic_partitions`: one DELETE on Dagster's `dynamic_partitions` table for a page of
  keys. The public `instance.delete_dynamic_partition` takes one key and opens its own
  connections: 0.1 s a key on PostgreSQL here, an hour for a 36,000-key retention catch-up.
- `defs_state_storage`: names an instance's defs-state storage while definitions load in this
  process. Dagster resolves it from a context variable; one left there by an instance since
  collected fails the load ("Attempted to resolve undefined DagsterInstance weakref", seen in a
  long test session).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from importlib import import_module
from typing import Any

import dagster as dg

DYNAMIC_PARTITIONS_TABLE = ("dagster._core.storage.event_log.schema", "DynamicPartitionsTable")
DYNAMIC_PARTITIONS_COLUMNS = ("partitions_def_name", "partition")
SET_DEFS_STATE_STORAGE = ("dagster._core.storage.defs_state.base", "set_defs_state_storage")
DEFS_STATE_STORAGE = ("dagster._core.storage.defs_state.base", "DefsStateStorage")


def _private(where: tuple[str, str]) -> Any:
    module, name = where
    return getattr(import_module(module), name)


def delete_dynamic_partitions(
    instance: dg.DagsterInstance, partitions_def_name: str, keys: list[str]
) -> None:
    """Removes `keys` from a dynamic partitions definition in one statement."""
    if not keys:
        return
    # Dagster's SQL schema loads SQLAlchemy and Alembic (~0.3 s): only when retention runs.
    table = _private(DYNAMIC_PARTITIONS_TABLE)
    with instance.event_log_storage.index_connection() as conn:
        conn.execute(
            table.delete().where(
                table.c.partitions_def_name == partitions_def_name, table.c.partition.in_(keys)
            )
        )


@contextmanager
def defs_state_storage(instance: dg.DagsterInstance) -> Iterator[None]:
    """While open, definitions loaded in this process use `instance`'s defs-state storage."""
    setting: AbstractContextManager = _private(SET_DEFS_STATE_STORAGE)(instance.defs_state_storage)
    with setting:
        yield


def defs_state_storage_in_context() -> Any:
    """The defs-state storage Dagster's context variable holds now (None: no instance entered).
    An instance entered and never exited (a sensor context built from an instance ref and not
    closed, say) leaves its storage there, and a later definitions load in the process fails."""
    return _private(DEFS_STATE_STORAGE).get()


def private_api_changes() -> list[str]:
    """What no longer matches in the installed Dagster (empty: every private API is as used here)."""
    changes: list[str] = []
    for where in (DYNAMIC_PARTITIONS_TABLE, SET_DEFS_STATE_STORAGE, DEFS_STATE_STORAGE):
        try:
            _private(where)
        except (ImportError, AttributeError) as exc:
            changes.append(f"{where[0]}.{where[1]} is gone ({exc})")
    if not changes:
        columns = set(_private(DYNAMIC_PARTITIONS_TABLE).c.keys())
        changes += [
            f"{DYNAMIC_PARTITIONS_TABLE[1]} has no column {c!r} (it has {sorted(columns)})"
            for c in DYNAMIC_PARTITIONS_COLUMNS
            if c not in columns
        ]
        parameters = list(inspect.signature(_private(SET_DEFS_STATE_STORAGE)).parameters)
        if parameters != ["storage"]:
            changes.append(f"{SET_DEFS_STATE_STORAGE[1]} takes {parameters}, not ['storage']")
        if not callable(getattr(_private(DEFS_STATE_STORAGE), "get", None)):
            changes.append(f"{DEFS_STATE_STORAGE[1]} has no get()")
    for attribute in ("defs_state_storage", "event_log_storage"):
        if not hasattr(dg.DagsterInstance, attribute):
            changes.append(f"DagsterInstance has no {attribute}")
    return changes
