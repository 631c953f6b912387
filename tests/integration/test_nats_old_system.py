"""Beside the system we replace: a nats-server that already holds its streams (created as its init
Job did: file storage, limits retention, 1 replica) works with our init, sensor and publishers,
and every one of those streams has the same config afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from fleet_pipelines import stack
from fleet_pipelines.domain.models import Role, Task, TurnKind
from fleet_pipelines.events.outbound import agent_response_events, collector_event
from fleet_pipelines.events.streams import PLANNING_REJECTED
from fleet_pipelines.resources.events import NatsResource
from tests.factories import read_subject, turn
from tests.integration.test_sensor_planning import publish_raw, seq, tick
from tests.unit.test_events import LEGACY

# The old system's streams (its NATS notes), plus the AGENT_RESPONSES its collector read (1 h).
OLD_STREAMS = {
    "PLANNING_EVENTS": ("planning.>", 30 * 86_400),
    "ORCHESTRATOR_EVENTS": ("orchestration.>", 7 * 86_400),
    "CONTEXT_EVENTS": ("context.>", 7 * 86_400),
    "AGENT_RESULTS": ("agent.results.>", 3_600),
    "VLLM_STREAMING": ("vllm.streaming.>", 600),
    "AGENT_RESPONSES": ("agent.response.>", 3_600),
}


@pytest.fixture
def old_system_nats(tmp_path: Path):
    port = stack.free_port()
    server = stack.start_nats(tmp_path / "logs", port, tmp_path / "store")
    nats = NatsResource(url=f"nats://127.0.0.1:{port}")

    async def create(session) -> None:
        for name, (subject, max_age) in OLD_STREAMS.items():
            await session.js.add_stream(
                StreamConfig(
                    name=name,
                    subjects=[subject],
                    max_age=float(max_age),
                    storage=StorageType.FILE,
                    retention=RetentionPolicy.LIMITS,
                    num_replicas=1,
                )
            )

    nats.session(create, ensure_streams=False)
    yield nats
    server.stop()


def configs(nats: NatsResource) -> dict[str, dict]:
    async def work(session) -> dict[str, dict]:
        return {name: (await session.js.stream_info(name)).config.as_dict() for name in OLD_STREAMS}

    return nats.session(work, ensure_streams=False)


def fleet(nats: NatsResource, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleet_pipelines.cli", *args],
        env={**os.environ, "NATS_URL": nats.url},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_init_sensor_and_publishers_work_beside_the_old_streams_and_leave_them_unchanged(
    old_system_nats: NatsResource, dagster_instance
):
    nats = old_system_nats
    before = configs(nats)

    dry = fleet(nats, "nats", "init", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    init = fleet(nats, "nats", "init")
    assert init.returncode == 0, init.stderr
    lines = dict(line.split(": ", 1) for line in init.stdout.splitlines())
    for name in OLD_STREAMS:
        assert lines[name].startswith(f"use {name} (") and "not ours" in lines[name]
    assert lines["AGENT_REVIEWS"].startswith("create") and lines["DELIBERATION_RESULTS"].startswith("create")
    assert dry.stdout.splitlines() == [*init.stdout.splitlines(), "dry run: nothing was changed"]

    # The planner's plans in its PLANNING_EVENTS start runs; a bad one is dead-lettered into its
    # ORCHESTRATOR_EVENTS.
    publish_raw(nats, LEGACY, msg_id="plan-42")
    publish_raw(nats, b"[" * 50_000)
    requests, cursor, _, _ = tick(dagster_instance, nats, None)
    assert seq(cursor) == 2 and [r.tags["fleet/role"] for r in requests] == ["DEV", "QA"]
    [dead] = read_subject(nats, "ORCHESTRATOR_EVENTS", PLANNING_REJECTED)
    assert dead["payload"]["stream_sequence"] == 2

    # `fleet deliberate` publishes its plan through the same streams.
    deliberate = fleet(nats, "deliberate", "Write add(a, b).", "--role", "DEV", "--task-id", "old-1")
    assert deliberate.returncode == 0, deliberate.stderr

    # Our per-turn events, agent.results and the collector's summary land in the old streams
    # (and ours for reviews and collector results), each acked.
    task = Task(task_id="old-1", description="d", role=Role.DEV, num_agents=1, rounds=1)
    proposal = turn(content="def add(a, b): return a + b", task_id="old-1")
    critique = proposal.model_copy(update={"kind": TurnKind.CRITIQUE, "round": 1})
    events = [
        *agent_response_events(task, [proposal, critique], "run-1"),
        collector_event(task, [proposal], "run-1", 5.0),
    ]
    acks = nats.publish(events)
    assert len(acks) == 4 and not any(duplicate for _, duplicate in acks)
    worker = read_subject(nats, "AGENT_RESULTS", "agent.results.old-1")
    assert worker[0]["agent_id"] == "agent-dev-001" and worker[0]["proposal"]["content"].startswith("def add")
    collected = read_subject(nats, "DELIBERATION_RESULTS", "deliberation.completed")
    assert collected[0]["successful_responses"] == 1

    assert configs(nats) == before
