"""The whole deliberation_job in process with the scripted turn runner: no engine, no Ray.

The assets, the IO manager, the sandbox, ruff, the checks and NATS events are the real ones
(the session's nats-server from conftest); only the agents' replies are scripted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from fleet_pipelines.assets.deliberation import (
    build_deliberation_job,
    deliberation_assets,
    deliberation_partitions,
    deliberation_run_config,
)
from fleet_pipelines.domain.decision import Decision
from fleet_pipelines.domain.models import DeliberationStatus, TurnKind, TurnResult
from fleet_pipelines.domain.scoring import ProposalScore
from fleet_pipelines.events.planning import InvalidEvent, StreamMessage, plan_deliberations
from fleet_pipelines.events.streams import PLAN_APPROVED, PLANNING_STREAM
from fleet_pipelines.history.stored import dump_value, read_stored, stored_path
from fleet_pipelines.history.task_result import stored_result
from fleet_pipelines.names import DELIBERATION_JOB
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.resources.io import DomainIOManager
from tests.scripted import ScriptedTurnRunner

ADD = "def add(a, b):\n    return a + b"


def run_job(tmp_path: Path, nats_url: str, task_id: str, task_fields: dict, runner: ScriptedTurnRunner):
    defs = dg.Definitions(
        assets=deliberation_assets,
        jobs=[build_deliberation_job()],
        resources={
            "turn_runner": runner,
            "council": CouncilResource(),
            "io_manager": DomainIOManager(base_path=str(tmp_path / "storage")),
            "nats": NatsResource(url=nats_url),
        },
    )
    (tmp_path / "home").mkdir(parents=True)
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
        return defs.resolve_job_def(DELIBERATION_JOB).execute_in_process(
            run_config=deliberation_run_config(task_fields), instance=instance, partition_key=task_id
        )


def test_the_job_passes_domain_objects_from_task_to_decision(tmp_path: Path, nats_server: str):
    fields = {"description": "Write add(a, b).", "role": "DEV", "num_agents": 3, "rounds": 1}
    result = run_job(tmp_path, nats_server, "job-1", fields, ScriptedTurnRunner(code=ADD))
    assert result.success

    proposals: list[TurnResult] = result.output_for_node("proposals")
    assert [p.agent_id for p in proposals] == ["agent-dev-001", "agent-dev-002", "agent-dev-003"]
    reviews: list[TurnResult] = result.output_for_node("reviews")
    assert sorted(r.kind for r in reviews).count(TurnKind.CRITIQUE) == 6
    assert [r.kind for r in reviews].count(TurnKind.REVISE) == 3
    scores: list[ProposalScore] = result.output_for_node("scores")
    assert [s.agent_id for s in scores] == [p.agent_id for p in proposals]
    assert all(s.value("code_parses") == 1.0 and s.value("judge") == 0.7 for s in scores)
    decision: Decision = result.output_for_node("decision")
    assert decision.status is DeliberationStatus.COMPLETED
    assert decision.winner_id == "agent-dev-001"  # equal scores and verdicts: council order
    assert ADD in decision.winner_content
    # The IO manager stored the domain objects; they read back without the code location.
    assert read_stored(str(tmp_path / "storage"), "decision", "job-1") == decision
    assert read_stored(str(tmp_path / "storage"), "reviews", "job-1") == reviews
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"quorum_met": True, "winner_passes_checks": True}


def test_failed_agents_give_a_partial_decision(tmp_path: Path, nats_server: str):
    fields = {"description": "Write add(a, b).", "role": "QA", "num_agents": 3, "rounds": 0}
    runner = ScriptedTurnRunner(code=ADD, fail_agents=["agent-qa-003"])
    decision = run_job(tmp_path, nats_server, "job-2", fields, runner).output_for_node("decision")
    assert decision.status is DeliberationStatus.PARTIAL and decision.failed_agents == ["agent-qa-003"]


def planned(task: dict) -> list:
    body = {
        "story_id": "S-1",
        "plan_id": "P-1",
        "approved_by": "planner",
        "roles": ["DEV"],
        "tasks": [task],
        "approved_at": "2026-01-01T00:00:00Z",
    }

    message = StreamMessage(
        stream=PLANNING_STREAM, seq=1, subject=PLAN_APPROVED, data=json.dumps(body).encode()
    )
    return plan_deliberations(message)


def test_a_plan_carrying_tests_and_examples_has_its_tests_check_scored(tmp_path: Path, nats_server: str):
    [plan] = planned(
        {
            "task_id": "add-1",
            "description": "Write add(a, b).",
            "role": "DEV",
            "num_agents": 2,
            "rounds": 0,
            "tests": "assert add(1, 2) == 3\n\ndef test_negative():\n    assert add(-1, -1) == -2\n",
            "examples": [{"call": "add(2, 2)", "expected": "4"}],
        }
    )
    assert plan.task_config["examples"] == [{"call": "add(2, 2)", "expected": "4"}]
    right = run_job(
        tmp_path / "right", nats_server, plan.task_id, plan.task_config, ScriptedTurnRunner(code=ADD)
    )
    for score in right.output_for_node("scores"):
        tests = score.check("tests")
        assert tests.value == 1.0 and tests.ran.startswith("sandbox"), tests
    wrong = ScriptedTurnRunner(code="def add(a, b):\n    return a - b")
    for score in run_job(
        tmp_path / "wrong", nats_server, plan.task_id, plan.task_config, wrong
    ).output_for_node("scores"):
        assert score.value("tests") == 0.0


def test_the_ui_shows_the_check_results_each_author_saw_before_revising(tmp_path: Path, nats_server: str):
    fields = {
        "description": "Write add(a, b).",
        "role": "DEV",
        "num_agents": 2,
        "rounds": 1,
        "tests": "def test_negative():\n    assert add(-1, -1) == -2\n",
    }
    wrong = ScriptedTurnRunner(code="def add(a, b):\n    return a - b")
    result = run_job(tmp_path, nats_server, "add-fb", fields, wrong)
    [reviews] = result.asset_materializations_for_node("reviews")
    assert reviews.metadata["execution_feedback"].value is True
    shown = reviews.metadata["feedback_shown"].value
    assert "agent-dev-001, version of round 0" in shown and "FAIL test_negative" in shown


def test_an_unknown_task_field_rejects_the_plan_naming_it():
    with pytest.raises(InvalidEvent, match="tets: Extra inputs are not permitted"):
        planned({"description": "Write add(a, b).", "role": "DEV", "tets": "assert add(1, 2) == 3"})


def test_fleet_result_answers_a_decided_task_from_storage_without_dagster(tmp_path: Path, nats_server: str):
    fields = {"description": "Write add(a, b).", "role": "DEV", "num_agents": 2, "rounds": 0}
    result = run_job(tmp_path, nats_server, "quick-1", fields, ScriptedTurnRunner(code=ADD))
    decision: Decision = result.output_for_node("decision")
    storage = str(tmp_path / "storage")
    env = {**os.environ, "FLEET_STORAGE_PATH": storage, "DAGSTER_HOME": str(tmp_path / "no-home")}
    script = (
        "import sys\nfrom fleet_pipelines.cli import fleet\n"
        "try:\n    fleet(['result', 'quick-1', '--json'])\n"
        "except SystemExit as exit:\n"
        "    print('dagster' in sys.modules, exit.code, file=sys.stderr)\n"
    )
    shown = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    answer = json.loads(shown.stdout)
    assert answer["status"] == "COMPLETED" and answer["run_id"] == result.run_id
    assert answer["winner_id"] == decision.winner_id and answer["winner_content"] == decision.winner_content
    assert shown.stderr.split() == ["False", "0"]  # no Dagster loaded, exit code of COMPLETED

    # A newer run of the task has started (it stored the task; its decision is not there yet):
    # the stored decision is not the answer any more, the Dagster instance is asked.
    newer = dump_value(read_stored(storage, "deliberation_task", "quick-1"), "a-newer-run")
    stored_path(storage, "deliberation_task", "quick-1").write_text(newer)
    assert stored_result(storage, "quick-1") is None
    assert stored_result(storage, "never-decided") is None


def test_every_run_of_the_registered_job_carries_its_engine_tag():
    """Runs started by the sensor, the launchpad or `fleet run` alike: the run queue limits them
    per engine (dagster.yaml's `fleet/engine` limit)."""
    from fleet_pipelines.definitions import defs, settings

    job = defs.resolve_job_def(DELIBERATION_JOB)
    # Both: the daemon tags sensor runs with the job's run tags, GraphQL launches with its tags.
    assert job.run_tags["fleet/engine"] == job.tags["fleet/engine"] == settings.engine_id()
