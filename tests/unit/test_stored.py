"""Stored asset values name their model among ours; a file never decides what gets imported."""

from __future__ import annotations

import json
import sys

import pytest

from fleet_pipelines.domain.councils import Convened
from fleet_pipelines.domain.limits import SandboxLimits
from fleet_pipelines.domain.models import Role, Task, TurnResult
from fleet_pipelines.history.stored import STORED_MODELS, StoredValueError, dump_value, load_value
from fleet_pipelines.resources.council import CouncilResource
from tests.factories import turn


def test_a_stored_value_naming_a_foreign_class_is_refused_and_nothing_is_imported():
    stored = json.loads(dump_value(turn(content="x")))
    for foreign in ("antigravity:Decision", "this:TurnResult", "os:system", "fleet_pipelines.cli:fleet"):
        with pytest.raises(StoredValueError, match="is not one of Task, StoryContext, Workspace, Convened"):
            load_value(json.dumps({**stored, "model": foreign}))
    assert "antigravity" not in sys.modules and "this" not in sys.modules


def test_values_load_by_their_registered_name_and_files_of_the_earlier_format_still_load():
    value = [turn("agent-dev-001", "a"), turn("agent-dev-002", "b")]
    assert load_value(dump_value(value), list[TurnResult]) == value
    earlier = {**json.loads(dump_value(value)), "model": "fleet_pipelines.domain.models:TurnResult"}
    assert load_value(json.dumps(earlier)) == value
    assert set(STORED_MODELS) == {
        "Task",
        "StoryContext",
        "Workspace",
        "Convened",
        "TurnResult",
        "ProposalScore",
        "Decision",
        "PushedBranch",
    }


def test_a_council_stored_before_it_carried_sandbox_limits_and_a_quorum_still_loads():
    task = Task(task_id="t", description="d", role=Role.DEV, num_agents=3)
    convened = CouncilResource(quorum=2).convene(task)
    stored = json.loads(dump_value(convened))
    for field in ("sandbox", "quorum"):
        del stored["value"][field]
    loaded = load_value(json.dumps(stored), Convened)
    assert loaded.sandbox == SandboxLimits() and loaded.quorum is None  # the defaults: a majority
    assert loaded.model_copy(update={"quorum": 2}) == convened


def test_a_value_of_another_type_than_the_asset_declares_is_refused():
    with pytest.raises(StoredValueError, match="is not a"):
        load_value(dump_value(turn(content="x")), list[TurnResult])
