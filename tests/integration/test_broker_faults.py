"""Broker faults (issue 7): nats-server restarted, JetStream store kept, while 1,000 approved events
are published and drained by the planning sensor. Every event ends as exactly one run request or
one rejection: none lost, none duplicated."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from fleet_pipelines import stack
from fleet_pipelines.events.models import EventEnvelope
from fleet_pipelines.events.streams import PLAN_APPROVED, PLANNING_REJECTED, PLANNING_STREAM, NatsError
from fleet_pipelines.resources.events import NatsResource
from tests.factories import plan, plan_envelope
from tests.integration.test_sensor_planning import seq, tick

EVENTS = 1_000
RESTART_AT = 400


def event(i: int) -> EventEnvelope:
    """Every tenth event is invalid (a role no council has)."""
    role = "CHEF" if i % 10 == 9 else ["DEV", "QA", "ARCHITECT", "DEVOPS", "DATA"][i % 5]
    task = {"task_id": f"bf-task-{i}", "description": f"Task {i}", "role": role}
    return plan_envelope(f"bf-{i}", plan(f"US-{i}", f"P-{i}", roles=None, tasks=[task]))


def test_nats_restart_mid_stream_loses_and_duplicates_nothing(dagster_instance, tmp_path: Path):
    port, store, logs = stack.free_port(), tmp_path / "store", tmp_path / "logs"
    server = stack.start_nats(logs, port, store)
    nats = NatsResource(url=f"nats://127.0.0.1:{port}", connect_timeout_s=0.5, request_timeout_s=2.0)
    published = threading.Event()
    progress = [0]
    publish_retries = [0]
    restarted = threading.Event()

    def publisher() -> None:
        for i in range(EVENTS):
            while True:  # a publisher that retries with the same Nats-Msg-Id until acked
                try:
                    nats.publish([(PLAN_APPROVED, event(i))])
                    break
                except NatsError:
                    publish_retries[0] += 1
                    time.sleep(0.1)
            progress[0] = i + 1
        published.set()

    def restarter() -> None:
        nonlocal server
        while progress[0] < RESTART_AT:
            time.sleep(0.01)
        server.stop()  # SIGTERM mid-stream: nats-server flushes its JetStream store and exits
        time.sleep(1.0)
        server = stack.start_nats(logs, port, store)
        restarted.set()

    chaos = threading.Thread(target=restarter)
    chaos.start()
    thread = threading.Thread(target=publisher)
    thread.start()
    cursor, keys, skips, ticks = None, [], [], 0
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            requests, new_cursor, skip, _ = tick(dagster_instance, nats, cursor)
            ticks += 1
            keys.extend(r.run_key for r in requests)
            if skip:
                skips.append(skip)
            cursor = new_cursor or cursor
            if published.is_set() and seq(cursor) == EVENTS and not requests:
                break
            time.sleep(0.05)
    finally:
        thread.join()
        chaos.join()
        server.stop()
    assert restarted.is_set()
    assert seq(cursor) == EVENTS, f"sensor stopped at {cursor}"

    valid = {f"bf-{i}:bf-task-{i}" for i in range(EVENTS) if i % 10 != 9}
    assert len(keys) == len(set(keys)), "duplicated run requests"
    assert set(keys) == valid, f"lost {len(valid - set(keys))}"

    server = stack.start_nats(logs, port, store)
    try:

        async def rejected(session) -> list[int]:
            seqs = []
            async for m in session.read_after(
                "ORCHESTRATOR_EVENTS", PLANNING_REJECTED, 0, 10_000, time.monotonic() + 30
            ):
                seqs.append(json.loads(m.data)["payload"]["stream_sequence"])
            return seqs

        dead_letters = nats.session(rejected)
        stored = nats.session(lambda s: s.last_seq(PLANNING_STREAM))
    finally:
        server.stop()
    assert stored == EVENTS, "retried publishes were stored twice"
    assert len(dead_letters) == len(set(dead_letters)) == EVENTS // 10
    print(
        f"\nbroker restart: {EVENTS} events, {len(keys)} run requests, {len(dead_letters)} rejections, "
        f"lost 0, duplicated 0; {ticks} ticks, {len(skips)} skipped while the server was down, "
        f"{publish_retries[0]} publish retries"
    )
