"""Issue 13 on a real nats-server: poison messages never halt the planning sensor, dead letters stay
sendable, run keys and message ids never collide, and a reset stream is detected and re-read."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from fleet_pipelines import stack
from fleet_pipelines.events.models import EventEnvelope
from fleet_pipelines.events.planning import single_task_plan
from fleet_pipelines.events.streams import PLAN_APPROVED, PLANNING_REJECTED, PLANNING_STREAM
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.sensors.planning import Cursor, drain
from tests.factories import read_subject
from tests.integration.test_sensor_planning import publish_raw, seq, tick
from tests.unit.test_events import LEGACY

TASK = {"description": "Write add(a, b).", "role": "DEV", "num_agents": 1, "rounds": 0}


def plan(key: str, task_id: str) -> bytes:
    return single_task_plan(task_id, TASK, "S", f"P-{task_id}", "po", key).model_dump_json().encode()


def dead_letters(nats: NatsResource) -> list[dict]:
    return [e["payload"] for e in read_subject(nats, "ORCHESTRATOR_EVENTS", PLANNING_REJECTED)]


def test_each_poison_message_of_the_issue_is_dead_lettered_and_the_next_plan_runs(
    dagster_instance, nats_resource
):
    nats_resource.ensure_streams()
    binary = bytes(range(256)) * 800  # 200 kB, not UTF-8: its dead letter once grew to 1.2 MB
    for poison in (b"[" * 50_000, b"1" * 5_000, binary):
        publish_raw(nats_resource, poison)
    publish_raw(nats_resource, LEGACY)

    requests, cursor, _, _ = tick(dagster_instance, nats_resource, None)
    assert seq(cursor) == 4
    assert [r.tags["fleet/role"] for r in requests] == ["DEV", "QA"]

    deep, digits, big = dead_letters(nats_resource)
    assert "nested too deeply" in deep["reason"] and deep["original_text"] == "[" * 50_000
    assert digits["reason"].startswith("not JSON") and "digits" in digits["reason"]
    assert big["original_size"] == len(binary) and big["original_truncated"]
    assert big["original_sha256"] == hashlib.sha256(binary).hexdigest()
    assert binary.startswith(base64.b64decode(big["original_base64"]))


def test_a_dead_letter_over_the_servers_max_payload_is_sent_minimal(dagster_instance, tmp_path: Path):
    config = tmp_path / "nats.conf"
    config.write_text("max_payload: 65536\n")
    port = stack.free_port()
    server = stack.start_nats(tmp_path / "logs", port, tmp_path / "store", config_file=config)
    nats = NatsResource(url=f"nats://127.0.0.1:{port}")
    try:
        # 60 kB of control characters: JSON escapes make its bounded dead letter 360 kB.
        body = b"\x01" * 60_000
        publish_raw(nats, body)
        publish_raw(nats, LEGACY)
        requests, cursor, _, _ = tick(dagster_instance, nats, None)
        assert seq(cursor) == 2 and len(requests) == 2
        [minimal] = dead_letters(nats)
        assert minimal["stream_sequence"] == 1 and minimal["reason"].startswith("not JSON")
        assert minimal["original_text"] is None and minimal["original_base64"] is None
        assert (
            minimal["original_size"] == 60_000
            and minimal["original_sha256"] == hashlib.sha256(body).hexdigest()
        )
    finally:
        server.stop()


def test_keys_with_colons_and_non_ascii_message_ids_start_one_run_each(dagster_instance, nats_resource):
    publish_raw(nats_resource, plan("k:x", "y"), msg_id="m1")
    publish_raw(nats_resource, plan("k", "x:y"), msg_id="m2")  # once `k:x:y` too: dropped as a duplicate
    publish_raw(nats_resource, LEGACY, msg_id="plan-é")
    publish_raw(nats_resource, LEGACY, msg_id="plan-ü")  # once both read back as plan-\ufffd\ufffd
    requests, _, _, _ = tick(dagster_instance, nats_resource, None)
    keys = [r.run_key for r in requests]
    assert len(keys) == 6 == len(set(keys))
    assert {k.split(":")[0] for k in keys[2:]} == {"plan-é", "plan-ü"}


def test_our_publisher_deduplicates_non_ascii_keys_by_their_bytes(nats_resource):
    def envelope(key: str) -> EventEnvelope:
        return EventEnvelope(event_type=PLAN_APPROVED, idempotency_key=key, correlation_id="c", payload={})

    acks = nats_resource.publish([(PLAN_APPROVED, envelope(k)) for k in ("ключ-1", "ключ-2", "ключ-1")])
    assert [duplicate for _, duplicate in acks] == [False, False, True]


def test_a_recreated_stream_is_detected_re_read_and_replays_start_nothing_new(
    dagster_instance, nats_resource
):
    publish_raw(nats_resource, plan("a", "task-a"), msg_id="a")
    first, cursor, _, _ = tick(dagster_instance, nats_resource, None)
    assert seq(cursor) == 1 and len(first) == 1

    async def recreate(session) -> None:
        await session.js.delete_stream(PLANNING_STREAM)
        await session.ensure_streams()

    nats_resource.session(recreate, ensure_streams=False)
    # The planner re-sends plan a into the new stream, then b: both at sequences the cursor passed.
    publish_raw(nats_resource, plan("a", "task-a"), msg_id="a")
    publish_raw(nats_resource, plan("b", "task-b"), msg_id="b")
    drained = nats_resource.session(lambda s: drain(s, Cursor.parse(cursor), 100, 5.0))
    assert "stream reset" in drained.warning and "recreated" in drained.warning
    requests, cursor, _, _ = tick(dagster_instance, nats_resource, cursor)
    assert seq(cursor) == 2
    # a's run key is the one the daemon already used (it starts nothing); b runs.
    assert [r.run_key for r in requests] == [first[0].run_key, "b:task-b"]

    # A cursor past the end (a bare sequence from before streams were checked) is a reset too.
    drained = nats_resource.session(lambda s: drain(s, Cursor(seq=9), 100, 5.0))
    assert "past the end" in drained.warning and drained.cursor.seq == 2 and len(drained.planned) == 2
