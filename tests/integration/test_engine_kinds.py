"""An engine kind is its module and one line in the registry (`llm.kinds.KINDS`): a toy kind
(tests/toy_engine.py) added that way is read by the settings (its variables, bounded by its
fields; its secrets), the wiring and the config (its section, in Dagster's config schema)
and the admission queue, which admits as many of its turns at once as its capacity says.

The registry is read where the code location derives its settings and config, at import, as a
line of `KINDS` is: so the line is added in a fresh interpreter before anything else imports it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import asyncio, json, sys

from fleet_pipelines.llm.kinds import KINDS
from tests.toy_engine import TOY, ToyEngine, ToySettings

KINDS["toy"] = TOY  # the registry line

import dagster as dg
from pydantic import ValidationError

from fleet_pipelines import wiring
from fleet_pipelines.dispatch.admission import EngineQueue, Submission, queue_name
from fleet_pipelines.domain.models import Message, Role, TurnKind, TurnRequest
from fleet_pipelines.resources.config import EngineConfig
from fleet_pipelines.settings import SECRET_FILE_VARIABLES, FleetSettings

state = {"FLEET_STATE_DIR": sys.argv[1]}
env = {**state, "FLEET_ENGINE_BACKEND": "toy", "FLEET_LLM_MODEL": "toy-1", "FLEET_TOY_SLOTS": "2",
       "FLEET_TOY_TOKEN": "t0k"}
settings = FleetSettings.from_env(env)
try:
    FleetSettings.from_env({**env, "FLEET_TOY_SLOTS": "0"})
    refused = None
except ValidationError as exc:
    refused = str(exc)
runner = wiring.resources(settings)["turn_runner"]
toy = runner.engine.to_model()


@dg.op
def model_of(config: EngineConfig) -> str:
    return config.model_name


@dg.job
def probe():
    model_of()


run_config = {"ops": {"model_of": {"config": {"backend": "toy", "toy": {"model": "toy-2", "slots": 3}}}}}
validated = dg.validate_run_config(probe, run_config)["ops"]["model_of"]["config"]

def request(n):
    return TurnRequest(task_id="t", agent_id=f"agent-{n}", role=Role.DEV, kind=TurnKind.PROPOSE,
                       round=0, messages=[Message(role="user", content=f"turn {n}")], temperature=0.0,
                       max_tokens=16)


async def through_the_queue():
    queue = EngineQueue(toy, chunk_interval_s=0.0)
    turns = [Submission(f"turn-{n}", request(n), float("inf")) for n in range(5)]
    await queue.submit(turns)
    results = {}
    while len(results) < len(turns):
        news = await queue.poll({t.turn_id: 0 for t in turns if t.turn_id not in results}, 1.0)
        results.update({turn_id: n.result for turn_id, n in news.items() if n.result is not None})
    return queue.capacity, [results[t.turn_id].content for t in turns]


capacity, answers = asyncio.run(through_the_queue())
print(json.dumps({
    "backend": settings.engine_backend,
    "toy_slots": settings.toy_slots,
    "secrets_set": settings.engine_secrets_set,
    "secret_files": "FLEET_TOY_TOKEN" in SECRET_FILE_VARIABLES,
    "engine_id": settings.engine_id(),
    "refused": refused,
    "config_backend": runner.engine.backend,
    "config_token": runner.engine.toy.token,
    "settings": [type(toy).__name__, toy.model, toy.slots],
    "model_name": runner.model_name,
    "dagster_model": EngineConfig(**validated).model_name,
    "capacity": capacity,
    "peak": ToyEngine.peak,
    "answers": answers,
    "queue": queue_name(toy, None, "v1"),
}))
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What the code location does with the toy kind registered, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path_factory.mktemp("state"))],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_settings_read_its_variables_bounded_by_its_fields_and_its_secrets(toy: dict):
    assert toy["backend"] == "toy" and toy["toy_slots"] == 2
    assert "FLEET_TOY_SLOTS\n  Input should be greater than or equal to 1" in toy["refused"]
    assert toy["secrets_set"] == ["FLEET_TOY_TOKEN"] and toy["secret_files"]
    assert toy["engine_id"] == "toy:toy-1"


def test_the_wiring_and_the_config_build_its_settings(toy: dict):
    assert toy["config_backend"] == "toy"
    assert toy["config_token"] == "FLEET_TOY_TOKEN"  # a dg.EnvVar: the value stays out of config
    assert toy["settings"] == ["ToySettings", "toy-1", 2]
    assert toy["model_name"] == "toy-1"
    assert toy["dagster_model"] == "toy-2"  # Dagster's config schema takes its section


def test_the_admission_queue_admits_as_many_turns_at_once_as_its_capacity(toy: dict):
    assert toy["capacity"] == 2 and toy["peak"] == 2
    assert toy["answers"] == [f"toy answers turn {n}" for n in range(5)]
    assert toy["queue"].startswith("engine-queue-")
