"""The private Dagster APIs of fleet_pipelines/dagster_private.py, checked against the installed
Dagster: an upgrade that changes one fails here, naming what changed, before anything runs on it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import dagster as dg

from fleet_pipelines.dagster_private import defs_state_storage, delete_dynamic_partitions, private_api_changes

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def pinned_dagster() -> str:
    """The Dagster version pinned in pyproject.toml (the one place it is named)."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [pin] = [d for d in dependencies if re.match(r"dagster\s*==", d)]
    return pin.split("==")[1].strip()


def test_the_installed_dagster_is_the_pinned_one_and_its_private_apis_are_as_used():
    installed, pinned = dg.__version__, pinned_dagster()
    changes = private_api_changes()
    assert not changes, (
        f"Dagster {installed} (pinned: {pinned} in pyproject.toml) changed private APIs that "
        f"fleet_pipelines/dagster_private.py uses: {'; '.join(changes)}. Adapt that module, then the pin."
    )
    assert installed == pinned, (
        f"Dagster {installed} is installed but pyproject.toml pins {pinned}: the private APIs of "
        "fleet_pipelines/dagster_private.py are checked against the installed one; update the pin."
    )


def test_partitions_are_deleted_in_one_statement_and_only_those(dagster_instance: dg.DagsterInstance):
    dagster_instance.add_dynamic_partitions("deliberations", ["a", "b", "c"])
    dagster_instance.add_dynamic_partitions("stories", ["a"])
    delete_dynamic_partitions(dagster_instance, "deliberations", ["a", "c", "never-added"])
    assert dagster_instance.get_dynamic_partitions("deliberations") == ["b"]
    assert dagster_instance.get_dynamic_partitions("stories") == ["a"]


def test_definitions_load_against_the_named_instances_defs_state_storage(dagster_instance):
    from dagster._core.storage.defs_state.base import DefsStateStorage

    with dg.instance_for_test() as other:
        before = DefsStateStorage.get()
        with defs_state_storage(other):
            assert DefsStateStorage.get() is other.defs_state_storage
        assert DefsStateStorage.get() is before
