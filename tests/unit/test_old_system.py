"""What the old system's planners and deployments send still works, or is refused with a reason:
its task shape (`constraints`, `task_description`), `max_iterations`, and its variable names
(read at start-up by the CLI and the code location: tests/integration/test_old_system.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet_pipelines.domain.models import Task
from fleet_pipelines.events.planning import InvalidEvent, StreamMessage, plan_deliberations
from fleet_pipelines.events.streams import PLAN_APPROVED, PLANNING_STREAM
from tests.scripted import ScriptedTurnRunner
from tests.unit.test_deliberation_job import ADD, run_job

OLD_TASK = {
    "task_id": "old-1",
    "task_description": "Write add(a, b) in Python.",
    "role": "DEV",
    "num_agents": 2,
    "rounds": 1,
    "constraints": {
        "rubric": "Correct and tested.",
        "requirements": ["handles negative numbers", "has a docstring"],
        "metadata": {"service": "calculator"},
        "max_iterations": 3,
        "timeout_seconds": 120,
    },
}


def plan_with(task: dict) -> StreamMessage:
    body = {
        "story_id": "US-7",
        "plan_id": "P-7",
        "approved_by": "po",
        "approved_at": "2026-11-25T10:00:00Z",
        "tasks": [task],
    }
    return StreamMessage(stream=PLANNING_STREAM, seq=3, subject=PLAN_APPROVED, data=json.dumps(body).encode())


def test_a_plan_in_the_old_task_shape_starts_its_deliberation_with_its_constraints(
    tmp_path: Path, nats_server: str
):
    [planned] = plan_deliberations(plan_with(OLD_TASK))
    assert planned.task_id == "old-1"
    result = run_job(
        tmp_path, nats_server, planned.task_id, planned.task_config, ScriptedTurnRunner(code=ADD)
    )
    assert result.success
    task: Task = result.output_for_node("deliberation_task")
    assert task.description == "Write add(a, b) in Python."
    assert task.constraints.rubric == "Correct and tested."
    assert task.constraints.requirements == ["handles negative numbers", "has a docstring"]
    assert task.constraints.metadata == {"service": "calculator"}
    assert task.constraints.timeout_seconds == 120 and task.constraints.max_iterations == 3
    assert (task.story_id, task.plan_id) == ("US-7", "P-7")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"constraints": {**OLD_TASK["constraints"], "priority": "high"}},
            "constraints.priority: not a constraint",
        ),
        ({"constraints": ["Correct"]}, "constraints: expected an object, got list"),
        ({"rubric": "Other."}, "constraints.rubric and rubric: give one of them"),
        ({"description": "Also."}, "task_description and description: give one of them"),
        ({"owner": "x"}, "tasks.0.owner: Extra inputs are not permitted"),
        (
            {"rounds": 2, "constraints": {**OLD_TASK["constraints"], "max_iterations": 1}},
            "rounds 2 is more than constraints.max_iterations 1 (max_iterations caps the review rounds)",
        ),
    ],
)
def test_what_the_old_shape_cannot_mean_is_refused_with_its_name(change: dict, reason: str):
    with pytest.raises(InvalidEvent, match=reason.replace("(", r"\(").replace(")", r"\)")):
        plan_deliberations(plan_with({**OLD_TASK, **change}))


def test_a_planned_task_without_a_deadline_leaves_it_to_the_code_locations_default():
    task = {k: v for k, v in OLD_TASK.items() if k != "constraints"}
    [planned] = plan_deliberations(plan_with(task))
    assert "timeout_seconds" not in planned.task_config  # the launchpad default applies in the run


def test_the_readmes_old_shape_example_is_accepted_as_shown():
    import re

    from fleet_pipelines.cli import REPO_ROOT

    [example] = re.findall(r"```json\n(.*?)```", (REPO_ROOT / "README.md").read_text(), re.S)
    [planned] = plan_deliberations(plan_with(json.loads(example)))
    task = Task.from_fields(planned.task_id, planned.task_config)
    assert task.description == "Design the retry policy" and task.role.value == "ARCHITECT"
    assert task.constraints.requirements == ["idempotent"] and task.constraints.timeout_seconds == 600
    assert task.constraints.max_iterations == 3 and task.constraints.metadata == {"service": "payments"}
