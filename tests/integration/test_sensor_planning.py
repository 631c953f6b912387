"""Planning and run-failure sensors evaluated against a real nats-server and a real Dagster instance."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import deliberation_run_config
from fleet_pipelines.definitions import defs
from fleet_pipelines.events.streams import (
    COLLECTOR_FAILED,
    DELIBERATION_FAILED,
    PLAN_APPROVED,
    PLANNING_REJECTED,
    PLANNING_STREAM,
)
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.resources.history import HistoryResource
from fleet_pipelines.resources.repos import ReposResource
from fleet_pipelines.sensors import planning as planning_module
from fleet_pipelines.sensors.planning import PLANNING_SENSOR, Cursor
from fleet_pipelines.sensors.run_failure import RUN_FAILURE_SENSOR
from tests.factories import read_subject
from tests.unit.test_events import ENVELOPED, LEGACY

SENSOR = defs.get_sensor_def(PLANNING_SENSOR)  # the sensor as registered in the code location


def publish_raw(nats: NatsResource, data: bytes, msg_id: str | None = None) -> int:
    async def work(session) -> int:
        ack = await session.js.publish(
            PLAN_APPROVED, data, headers={"Nats-Msg-Id": msg_id} if msg_id else None
        )
        return ack.seq

    return nats.session(work)


def seq(cursor: str | None) -> int | None:
    """The stream sequence a sensor cursor stands at."""
    parsed = Cursor.parse(cursor)
    return parsed.seq if parsed else None


def tick(instance: dg.DagsterInstance, nats: NatsResource, cursor: str | None):
    """One sensor evaluation as the daemon runs it; returns (run requests, new cursor, skip, data)."""
    # Closed after the tick: the context enters an instance of its own from the ref, and one left
    # entered keeps its defs-state storage in Dagster's context variable after it is collected.
    with dg.build_sensor_context(
        instance_ref=instance.get_ref(),
        cursor=cursor,
        definitions=defs,
        resources={"nats": nats, "council": CouncilResource(), "repos": ReposResource()},
    ) as context:
        data = SENSOR.evaluate_tick(context)
    return data.run_requests or [], data.cursor, data.skip_message, data


def test_legacy_and_enveloped_plans_become_partitions_and_run_requests(dagster_instance, nats_resource):
    publish_raw(nats_resource, LEGACY)
    publish_raw(nats_resource, ENVELOPED, msg_id="b7c1")
    requests, cursor, _, data = tick(dagster_instance, nats_resource, None)

    assert seq(cursor) == 2
    assert [r.tags["fleet/role"] for r in requests] == ["DEV", "QA", "ARCHITECT"]
    [partitions] = data.dynamic_partitions_requests
    assert partitions.partitions_def_name == "deliberations"
    assert list(partitions.partition_keys) == [r.partition_key for r in requests]
    dev, _, architect = requests
    assert dev.run_config == deliberation_run_config(
        {
            "description": "Implement plan P-42 for story US-42",
            "role": "DEV",
            "story_id": "US-42",
            "plan_id": "P-42",
        }
    )
    assert dev.tags["fleet/story_id"] == "US-42" and dev.tags["fleet/plan_id"] == "P-42"
    assert architect.run_key == f"b7c1:{architect.partition_key}"
    assert architect.tags["fleet/correlation_id"] == "c9"
    dg.validate_run_config(_job(), dev.run_config)  # the config fits the real job


def test_a_tick_with_nothing_to_read_takes_a_plan_published_while_it_waits(dagster_instance, nats_resource):
    """The registered sensor waits (FLEET_PLANNING_WAIT_S) for a plan instead of returning empty:
    a plan published during the tick is in that tick's run requests, not the next one's."""
    publish_raw(nats_resource, LEGACY, msg_id="first")
    _, cursor, _, _ = tick(dagster_instance, nats_resource, None)
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(tick, dagster_instance, nats_resource, cursor)
        time.sleep(1.0)  # the tick has read nothing and waits
        assert not waiting.done()
        publish_raw(nats_resource, ENVELOPED, msg_id="while-waiting")
        requests, new_cursor, skip, _ = waiting.result(timeout=30)
    assert seq(new_cursor) == 2 and skip is None
    assert {r.run_key.split(":")[0] for r in requests} == {"b7c1"}  # the plan published meanwhile


def _job() -> dg.JobDefinition:
    return defs.resolve_job_def("deliberation_job")


def test_replayed_plans_start_no_new_runs(dagster_instance, nats_resource):
    publish_raw(nats_resource, LEGACY, msg_id="plan-42")
    first, cursor, _, _ = tick(dagster_instance, nats_resource, None)
    # The planner retries the publish: JetStream drops the copy (same Nats-Msg-Id) ...
    assert publish_raw(nats_resource, LEGACY, msg_id="plan-42") == 1
    none, same_cursor, skip, _ = tick(dagster_instance, nats_resource, cursor)
    assert none == [] and same_cursor == cursor and "no planning.plan.approved after seq 1" in skip
    # ... and a replay from the start (cursor lost) asks for the same run keys, which the daemon
    # drops as already used: no second run for any task.
    again, _, _, _ = tick(dagster_instance, nats_resource, None)
    assert [r.run_key for r in again] == [r.run_key for r in first]
    assert [r.partition_key for r in again] == [r.partition_key for r in first]


def test_malformed_plans_are_dead_lettered_and_the_tick_succeeds(dagster_instance, nats_resource):
    bad = [
        b"\xff not json",
        b'"a string"',
        json.dumps({"plan_id": "P", "approved_by": "x", "roles": ["DEV"], "approved_at": "t"}).encode(),
        json.dumps(
            {"story_id": "S", "plan_id": "P", "approved_by": "x", "roles": ["CHEF"], "timestamp": "t"}
        ).encode(),
        json.dumps(
            {
                "story_id": "S",
                "plan_id": "P",
                "approved_by": "x",
                "timestamp": "t",
                "tasks": [{"description": "d", "role": "DEV", "rounds": 9}],
            }
        ).encode(),
        b'{"x": "' + b"y" * 300_000 + b'"}',
    ]
    for data in bad:
        publish_raw(nats_resource, data)
    publish_raw(nats_resource, LEGACY)

    requests, cursor, _, _ = tick(dagster_instance, nats_resource, None)
    assert seq(cursor) == 7
    assert [r.tags["fleet/role"] for r in requests] == ["DEV", "QA"]

    rejected = [e["payload"] for e in read_subject(nats_resource, "ORCHESTRATOR_EVENTS", PLANNING_REJECTED)]
    assert [r["stream_sequence"] for r in rejected] == [1, 2, 3, 4, 5, 6]
    reasons = [r["reason"] for r in rejected]
    assert reasons[0].startswith("not JSON")
    assert reasons[1] == "not a JSON object: got str"
    assert "story_id: Field required" in reasons[2]
    assert "roles.0" in reasons[3] and "CHEF" in reasons[3]
    assert "tasks.0.rounds" in reasons[4]
    assert "over the 262144-byte limit" in reasons[5]
    assert rejected[0]["original_text"] is None and rejected[0]["original_base64"]
    assert json.loads(rejected[3]["original_text"])["roles"] == ["CHEF"]
    assert {r["stream"] for r in rejected} == {PLANNING_STREAM}


def test_a_tick_is_bounded_and_the_next_resumes_after_the_cursor(
    dagster_instance, nats_resource, monkeypatch
):
    monkeypatch.setattr(planning_module, "MAX_EVENTS_PER_TICK", 3)
    for i in range(5):
        publish_raw(nats_resource, ENVELOPED.replace(b"b7c1", f"key-{i}".encode()), msg_id=f"key-{i}")
    first, cursor, _, _ = tick(dagster_instance, nats_resource, None)
    second, cursor2, _, _ = tick(dagster_instance, nats_resource, cursor)
    assert (seq(cursor), seq(cursor2)) == (3, 5)
    keys = [r.run_key.split(":")[0] for r in [*first, *second]]
    assert keys == [f"key-{i}" for i in range(5)]


def test_server_stopped_between_ticks_skips_then_resumes_with_nothing_lost(dagster_instance, tmp_path: Path):
    port = stack.free_port()
    server = stack.start_nats(tmp_path / "logs", port, tmp_path / "store")
    nats = NatsResource(url=f"nats://127.0.0.1:{port}", connect_timeout_s=0.5)
    try:
        publish_raw(nats, ENVELOPED.replace(b"b7c1", b"before"), msg_id="before")
        first, cursor, _, _ = tick(dagster_instance, nats, None)
        assert seq(cursor) == 1 and len(first) == 1

        server.stop()
        down, down_cursor, skip, _ = tick(dagster_instance, nats, cursor)
        assert down == [] and down_cursor == cursor  # a skip leaves the cursor as it was
        assert "NATS unreachable" in skip and "cursor stays at 1" in skip

        server = stack.start_nats(tmp_path / "logs", port, tmp_path / "store")
        publish_raw(nats, ENVELOPED.replace(b"b7c1", b"after"), msg_id="after")
        resumed, cursor, _, _ = tick(dagster_instance, nats, cursor)
        assert seq(cursor) == 2
        assert [r.run_key.split(":")[0] for r in [*first, *resumed]] == ["before", "after"]
    finally:
        server.stop()


def test_run_failure_sensor_publishes_deliberation_failed(dagster_instance, nats_resource, tmp_path: Path):
    task_id = "crash-1"
    dagster_instance.add_dynamic_partitions("deliberations", [task_id])
    # A real run of the job that crashes in its first step (invalid role): no decision is made.
    # Only that step is selected, so the run needs no Ray or engine resource.
    result = _job().execute_in_process(
        asset_selection=[dg.AssetKey("deliberation_task")],
        run_config=deliberation_run_config({"description": "x", "role": "CHEF"}),
        instance=dagster_instance,
        partition_key=task_id,
        tags={"fleet/story_id": "S-1", "fleet/correlation_id": "corr-1"},
        raise_on_error=False,
    )
    assert not result.success
    run = dagster_instance.get_run_by_id(result.run_id)
    failure = next(e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE")
    sensor = defs.get_sensor_def(RUN_FAILURE_SENSOR)
    context = dg.build_run_status_sensor_context(
        sensor_name=sensor.name,
        dagster_instance=dagster_instance,
        dagster_run=run,
        dagster_event=failure,
        resources={
            "nats": nats_resource,
            "history": HistoryResource(base_path=str(tmp_path), max_age_seconds=60),
        },
    ).for_run_failure()
    sensor(context)

    [event] = read_subject(nats_resource, "ORCHESTRATOR_EVENTS", DELIBERATION_FAILED)
    assert event["correlation_id"] == "corr-1"
    payload = event["payload"]
    assert payload["task_id"] == task_id and payload["status"] == "FAILED" and payload["run_id"] == run.run_id
    assert payload["story_id"] == "S-1"
    assert "role" in payload["decisions"][0]["rationale"]
    # The old system's collector form too, unenveloped, on deliberation.failed.
    [collector] = read_subject(nats_resource, "DELIBERATION_RESULTS", COLLECTOR_FAILED)
    assert (
        collector["task_id"] == task_id and collector["status"] == "failed" and "role" in collector["error"]
    )
