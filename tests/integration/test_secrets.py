"""Secrets (issue 7): the engine API key and the NATS token come from the environment only and
never appear in run config, Dagster's event log, the resource config the UI shows, or events.

The model server and nats-server both enforce them, so a run that succeeds proves they were used."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fleet_pipelines import stack, wiring
from fleet_pipelines.assets.deliberation import (
    materialize_deliberation,
)
from fleet_pipelines.domain.models import TurnStatus
from fleet_pipelines.events.streams import STREAMS
from fleet_pipelines.settings import FleetSettings

LLM_KEY = "sk-llm-SECRET-7f3a91"
NATS_TOKEN = "nats-SECRET-b8e2c4"


@pytest.fixture
def secured_stack(ray_head, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    logs = tmp_path / "logs"
    model_port, nats_port = stack.free_port(), stack.free_port()
    model = stack.start_model_server(logs, model_port, parallel=2, env={"FLEET_LLM_API_KEY": LLM_KEY})
    conf = tmp_path / "nats.conf"
    conf.write_text(f'authorization {{ token: "{NATS_TOKEN}" }}\n')
    nats = stack.start_nats(logs, nats_port, tmp_path / "nats-store", config_file=conf)
    monkeypatch.setenv("FLEET_LLM_BASE_URL", f"http://127.0.0.1:{model_port}/v1")
    monkeypatch.setenv("FLEET_LLM_API_KEY", LLM_KEY)
    monkeypatch.setenv("NATS_URL", f"nats://127.0.0.1:{nats_port}")
    monkeypatch.setenv("NATS_TOKEN", NATS_TOKEN)
    monkeypatch.setenv("FLEET_STORAGE_PATH", str(tmp_path / "storage"))
    monkeypatch.setenv("FLEET_MAX_TOKENS", "48")
    yield logs
    nats.stop()
    model.stop()


def _nats(token: str):
    """A resource with a literal token (outside a run, dg.EnvVar fields are not resolved)."""
    import os

    from fleet_pipelines.resources.events import NatsResource

    return NatsResource(url=os.environ["NATS_URL"], token=token)


def _stream_bodies(resource) -> list[bytes]:
    async def read(session) -> list[bytes]:
        bodies = []
        for spec in STREAMS:
            last = await session.last_seq(spec.name)
            for seq in range(1, last + 1):
                message = await session.js.get_msg(spec.name, seq=seq)
                bodies.append(message.data + json.dumps(dict(message.headers or {})).encode())
        return bodies

    return resource.session(read)


def test_secrets_stay_out_of_config_logs_and_events(secured_stack: Path, dagster_instance):
    resources = wiring.resources(FleetSettings.from_env())
    # What the UI shows of the resources: EnvVar references, never values.
    shown = json.dumps(
        {k: v.model_dump() if hasattr(v, "model_dump") else repr(v) for k, v in resources.items()},
        default=repr,
    )
    assert "FLEET_LLM_API_KEY" in shown and "NATS_TOKEN" in shown
    assert LLM_KEY not in shown and NATS_TOKEN not in shown

    task_id = "secrets-1"
    config = {"description": "Write add(a, b) in Python.", "role": "DEV", "num_agents": 2, "rounds": 0}
    result = materialize_deliberation(dagster_instance, resources, task_id, config)
    assert result.success  # both servers enforce their secret: the run used them
    assert all(p.status is TurnStatus.COMPLETED for p in result.output_for_node("proposals"))

    run = dagster_instance.get_run_by_id(result.run_id)
    assert LLM_KEY not in json.dumps(run.run_config) and NATS_TOKEN not in json.dumps(run.run_config)
    event_log = "\n".join(record.to_json() for record in dagster_instance.all_logs(result.run_id))
    assert "proposals" in event_log
    assert LLM_KEY not in event_log and NATS_TOKEN not in event_log

    bodies = _stream_bodies(_nats(NATS_TOKEN))
    assert any(b"agent.response.completed" in b for b in bodies)
    assert any(b"orchestration.deliberation.completed" in b for b in bodies)
    for body in bodies:
        assert LLM_KEY.encode() not in body and NATS_TOKEN.encode() not in body

    for log in secured_stack.glob("*.log"):
        text = log.read_text(errors="replace")
        assert LLM_KEY not in text and NATS_TOKEN not in text, log.name


def test_a_wrong_nats_token_is_refused(secured_stack: Path):
    from fleet_pipelines.events.streams import NatsError

    async def noop(session) -> None:
        await asyncio.sleep(0)

    with pytest.raises(NatsError) as exc:
        _nats("wrong-token").session(noop)
    assert "Authorization Violation" in str(exc.value) and "wrong-token" not in str(exc.value)
    _nats(NATS_TOKEN).session(noop)  # the right one is let in
