"""Streams and publishing against a real nats-server: idempotent ensure, dedup by Nats-Msg-Id."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fleet_pipelines.events.bus import NatsError, StreamChange
from fleet_pipelines.events.models import EventEnvelope
from fleet_pipelines.events.streams import PLAN_APPROVED, PLANNING_STREAM, STREAMS
from fleet_pipelines.resources.events import NatsResource

pytestmark = pytest.mark.integration


def test_ensure_creates_then_keeps_then_updates_a_changed_stream_without_losing_data(nats_resource):
    assert set(nats_resource.ensure_streams().values()) == {StreamChange.CREATED}
    assert set(nats_resource.ensure_streams().values()) == {StreamChange.UNCHANGED}
    envelope = EventEnvelope(event_type=PLAN_APPROVED, idempotency_key="k", correlation_id="c", payload={})
    nats_resource.publish([(PLAN_APPROVED, envelope)])

    async def shorten(session) -> None:
        info = await session.js.stream_info(PLANNING_STREAM)
        await session.js.update_stream(info.config.evolve(max_age=3600.0))

    nats_resource.session(shorten, ensure_streams=False)
    changes = nats_resource.ensure_streams()
    assert changes[PLANNING_STREAM] is StreamChange.UPDATED
    assert {changes[s.name] for s in STREAMS if s.name != PLANNING_STREAM} == {StreamChange.UNCHANGED}

    async def state(session):
        info = await session.js.stream_info(PLANNING_STREAM)
        return info.config.max_age, info.state.messages

    assert nats_resource.session(state, ensure_streams=False) == (30 * 86_400.0, 1)


def test_a_repeated_idempotency_key_is_dropped_by_jetstream(nats_resource):
    first = EventEnvelope(
        event_type=PLAN_APPROVED, idempotency_key="same", correlation_id="c", payload={"n": 1}
    )
    retry = first.model_copy(update={"payload": {"n": 2}})
    other = first.model_copy(update={"idempotency_key": "other"})
    acks = nats_resource.publish([(PLAN_APPROVED, first), (PLAN_APPROVED, retry), (PLAN_APPROVED, other)])
    assert acks == [(1, False), (1, True), (2, False)]


def test_unreachable_server_raises_promptly():
    with pytest.raises(NatsError, match="unreachable"):
        NatsResource(url="nats://127.0.0.1:1", connect_timeout_s=0.5).ensure_streams()


def test_fleet_nats_init_is_idempotent(nats_resource, nats_server):
    env = {**os.environ, "NATS_URL": nats_server}
    cmd = [sys.executable, "-m", "fleet_pipelines.cli", "nats", "init"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.count(": created") == len(STREAMS)
    assert second.stdout.count(": unchanged") == len(STREAMS)
