"""The whole deliberation_job in process with the scripted turn runner: no engine, no Ray.

The assets, the IO manager, the sandbox, ruff, the checks and NATS events are the real ones
(the session's nats-server from conftest); only the agents' replies are scripted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import (
    build_deliberation_job,
)
from fleet_pipelines.cli import fleet
from fleet_pipelines.domain.decision import Decision
from fleet_pipelines.domain.models import DeliberationStatus, TurnKind, TurnResult
from fleet_pipelines.domain.scoring import ProposalScore
from fleet_pipelines.events.outbound import turn_key
from fleet_pipelines.events.planning import InvalidEvent, StreamMessage, plan_deliberations
from fleet_pipelines.events.streams import DELIBERATION_FAILED, PLAN_APPROVED, PLANNING_STREAM, STREAMS
from fleet_pipelines.history.status import stored_result
from fleet_pipelines.history.stored import dump_value, read_stored, stored_path
from fleet_pipelines.names import DELIBERATION_JOB
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.resources.history import HistoryResource
from fleet_pipelines.sensors.outbox import build_outbox_sensor
from fleet_pipelines.sensors.run_failure import build_run_failure_sensor
from tests.factories import read_subject
from tests.jobs import deliberation_defs, deliberation_resources, run_deliberation
from tests.scripted import ScriptedTurnRunner

ADD = "def add(a, b):\n    return a + b"


def run_job(
    tmp_path: Path,
    nats: str | NatsResource,
    task_id: str,
    task_fields: dict,
    runner: ScriptedTurnRunner,
    instance: dg.DagsterInstance | None = None,
    raise_on_error: bool = True,
):
    """One deliberation_job run (in its own test instance unless `instance` is given)."""
    defs = deliberation_defs(deliberation_resources(tmp_path / "storage", nats, runner))
    if instance is not None:
        return run_deliberation(defs, instance, task_id, task_fields, raise_on_error)
    with dg.DagsterInstance.ephemeral() as instance:
        return run_deliberation(defs, instance, task_id, task_fields, raise_on_error)


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


def stream_messages(nats: NatsResource) -> dict[str, list[str]]:
    """The message ids in each of our streams."""

    async def work(session) -> dict[str, list[str]]:
        found = {}
        for spec in STREAMS:
            deadline = time.monotonic() + 5
            found[spec.name] = [
                m.msg_id async for m in session.read_after(spec.name, ">", 0, 10_000, deadline)
            ]
        return found

    return nats.session(work)


@pytest.mark.nats  # starts its own nats-server: the integration tier
def test_a_nats_outage_never_fails_a_run_and_its_events_arrive_once_when_nats_is_back(tmp_path: Path):
    port, storage = stack.free_port(), tmp_path / "storage"
    url = f"nats://127.0.0.1:{port}"  # nothing listens there yet: NATS is down before the run
    nats = NatsResource(url=url, outbox_path=str(storage / "outbox"), connect_timeout_s=0.5)
    fields = {
        "description": "Write add(a, b).",
        "role": "DEV",
        "num_agents": 2,
        "rounds": 1,
        "story_id": "S-1",
    }
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_job(tmp_path, nats, "down-1", fields, ScriptedTurnRunner(code=ADD), instance)
        assert result.success
        assert result.output_for_node("decision").status is DeliberationStatus.COMPLETED
        [told] = [
            m
            for m in result.asset_materializations_for_node("decision_events")
            if m.asset_key == dg.AssetKey("decision_events")
        ]
        kept = nats.outbox().pending(result.run_id)
        assert kept > 0 and told.metadata["events_pending"].value == kept
        assert "events pending: NATS unreachable" in told.metadata["events"].value
        shown = CliRunner().invoke(
            fleet, ["result", "down-1"], env={"FLEET_STORAGE_PATH": str(storage), "NATS_URL": url}
        )
        assert f"{kept} events pending" in shown.output, shown.output

        sensor = build_outbox_sensor()
        context = dg.build_sensor_context(instance=instance, resources={"nats": nats})
        assert "NATS" in sensor(context).skip_message  # still down: kept, nothing lost
        assert nats.outbox().pending(result.run_id) == kept

        backup = tmp_path / "outbox-copy"
        shutil.copytree(storage / "outbox", backup)
        server = stack.start_nats(tmp_path / "logs", port, tmp_path / "nats-store")
        try:
            said = sensor(dg.build_sensor_context(instance=instance, resources={"nats": nats})).skip_message
            assert f"sent {kept} kept events of 1 runs (0 already in the stream); 0 pending" in said
            ids = [i for messages in stream_messages(nats).values() for i in messages]
            assert len(ids) == len(set(ids)) == kept  # every event, once
            assert f"deliberation.outcome:{result.run_id}" in ids
            assert any(i.startswith("agent.response:") for i in ids)
            assert any(i.startswith("vllm.streaming:") for i in ids)  # live progress too
            assert nats.outbox().pending() == 0
            # A sender that died after the acks but before removing its batches sends them again:
            # JetStream drops the copies by their message ids.
            shutil.copytree(backup, storage / "outbox", dirs_exist_ok=True)
            report = nats.flush_outbox([result.run_id])
            assert (report.sent, report.duplicates, report.pending) == (kept, kept, 0)
            assert [i for messages in stream_messages(nats).values() for i in messages] == ids
        finally:
            server.stop()


def test_a_run_stopped_by_its_blocking_check_still_tells_its_outcome(tmp_path: Path, nats_resource):
    """No quorum: the blocking check fails the run after the decision is stored, so decision_events
    does not run; the failure sensor publishes the stored decision's outcome (FAILED, its reasons)."""
    fields = {"description": "Write add(a, b).", "role": "DEV", "num_agents": 2, "rounds": 0}
    runner = ScriptedTurnRunner(code=ADD, fail_agents=["agent-dev-001", "agent-dev-002"])
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_job(
            tmp_path, nats_resource, "noquorum-1", fields, runner, instance, raise_on_error=False
        )
        assert not result.success
        decided: Decision = result.output_for_node("decision")
        assert decided.status is DeliberationStatus.FAILED
        assert not result.asset_materializations_for_node("decision_events")
        run = instance.get_run_by_id(result.run_id)
        failure = next(e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE")
        sensor = build_run_failure_sensor(build_deliberation_job())
        history = HistoryResource(base_path=str(tmp_path / "storage"), max_age_seconds=60)
        context = dg.build_run_status_sensor_context(
            sensor_name=sensor.name,
            dagster_instance=instance,
            dagster_run=run,
            dagster_event=failure,
            resources={"nats": nats_resource, "history": history},
        ).for_run_failure()
        sensor(context)
    [outcome] = read_subject(nats_resource, "ORCHESTRATOR_EVENTS", DELIBERATION_FAILED)
    assert outcome["payload"]["run_id"] == result.run_id and outcome["payload"]["status"] == "FAILED"
    assert outcome["payload"]["reasons"] == decided.reasons
    [collected] = read_subject(nats_resource, "DELIBERATION_RESULTS", "deliberation.failed")
    assert collected["task_id"] == "noquorum-1" and collected["error"] == "All agents failed"
    # `fleet result` answers from the stored decision: FAILED, with the reasons that say why
    answered = stored_result(str(tmp_path / "storage"), "noquorum-1")
    assert answered is not None and answered.status.value == "FAILED" and answered.run_id == result.run_id
    assert answered.reasons == decided.reasons and decided.reasons


class StoppingRunner(ScriptedTurnRunner):
    """Stops the NATS server when the review turns start: NATS lost in the middle of a run."""

    def run_turns(self, requests, turn):
        if requests[0].kind is TurnKind.CRITIQUE:
            NATS_SERVERS[0].stop()
        return super().run_turns(requests, turn)


NATS_SERVERS: list = []


@pytest.mark.nats  # starts its own nats-server: the integration tier
def test_nats_lost_mid_run_loses_nothing_and_sends_nothing_twice(tmp_path: Path):
    port, storage = stack.free_port(), tmp_path / "storage"
    NATS_SERVERS[:] = [stack.start_nats(tmp_path / "logs", port, tmp_path / "nats-store")]
    nats = NatsResource(
        url=f"nats://127.0.0.1:{port}", outbox_path=str(storage / "outbox"), connect_timeout_s=0.5
    )
    fields = {"description": "Write add(a, b).", "role": "DEV", "num_agents": 2, "rounds": 1}
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_job(tmp_path, nats, "lost-1", fields, StoppingRunner(code=ADD), instance)
        assert result.success and nats.outbox().pending(result.run_id) > 0
        server = stack.start_nats(tmp_path / "logs", port, tmp_path / "nats-store")
        try:
            sensor = build_outbox_sensor()
            sensor(dg.build_sensor_context(instance=instance, resources={"nats": nats}))
            ids = [i for messages in stream_messages(nats).values() for i in messages]
        finally:
            server.stop()
    turns = [*result.output_for_node("proposals"), *result.output_for_node("reviews")]
    assert len(ids) == len(set(ids)) and nats.outbox().pending() == 0
    assert {f"agent.response:{turn_key(result.run_id, t)}" for t in turns} <= set(ids)
    assert f"deliberation.outcome:{result.run_id}" in ids
