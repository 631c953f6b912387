"""The vLLM actor's meter: its window is the actor's `max_model_len` (FLEET_VLLM_MAX_MODEL_LEN)
and a request is counted by the actor's own tokenizer, so tool turns fit the actor's requests as
they fit an HTTP engine's (older tool results left out, the reply capped). Here the actor is a
stand-in that answers `count`; the real actor's count against its tokens_in, and a real-project
task within a 2,048-token window, are in tests/integration/test_vllm_engines.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from ray.exceptions import GetTimeoutError

from fleet_pipelines.domain.models import TurnStatus
from fleet_pipelines.domain.tool_turns import ToolTurns
from fleet_pipelines.domain.tools import StepBudget
from fleet_pipelines.llm import vllm_actor
from fleet_pipelines.llm.settings import VLLMActorSettings
from fleet_pipelines.llm.vllm_actor_kind import VLLM_ACTOR
from fleet_pipelines.settings import FleetSettings
from tests.scripted import ScriptedEngine
from tests.unit.test_context_budget import request

SETTINGS = VLLMActorSettings(model="/models/m", served_model_name="m", max_model_len=2048)
ANSWER = json.dumps(
    {
        "edits": [{"path": "calc.py", "search": "    return a - b", "replace": "    return a + b"}],
        "rationale": "r",
    }
)


class ActorCount:
    """The engine actor's `count` method as Ray exposes it: `.remote(messages, tools)`."""

    def __init__(self, tokens: int):
        self.tokens = tokens
        self.asked: list[tuple[list[dict], list[dict] | None]] = []

    def remote(self, messages: list[dict], tools: list[dict] | None) -> int:
        self.asked.append((messages, tools))
        return self.tokens


@pytest.fixture
def actor(monkeypatch: pytest.MonkeyPatch) -> ActorCount:
    count = ActorCount(2000)
    actors = {SETTINGS.actor_name(): SimpleNamespace(count=count)}
    monkeypatch.setattr(vllm_actor, "engine_actor", lambda settings: actors[settings.actor_name()])
    monkeypatch.setattr(vllm_actor.ray, "get", lambda ref, timeout: ref)
    return count


def test_the_window_is_the_actors_max_model_len_as_its_variable_sets_it():
    settings = FleetSettings.from_env({"FLEET_VLLM_MODEL": "/models/m", "FLEET_VLLM_MAX_MODEL_LEN": "2048"})
    assert settings.vllm_max_model_len == 2048
    assert VLLM_ACTOR.meter(SETTINGS).window == 2048


def test_the_actor_counts_the_request_and_the_loop_caps_the_reply_to_what_is_left(actor: ActorCount):
    engine = ScriptedEngine(tool_replies={"a1": [ANSWER]})
    runner = ToolTurns(
        engine,
        lambda name, arguments: "",
        StepBudget(),
        protocol="json",
        files={"calc.py": "def add(a, b):\n    return a - b\n"},
        meter=VLLM_ACTOR.meter(SETTINGS),
    )
    [result] = runner([request(max_tokens=256)])
    assert result.status is TurnStatus.COMPLETED
    [[sent]] = engine.batches
    assert sent.max_tokens == 2048 - 2000  # what the actor's window leaves after its count
    messages, tools = actor.asked[-1]
    assert messages == [m.wire() for m in sent.messages] and tools is None


def test_a_request_the_actor_cannot_count_goes_as_it_is(actor: ActorCount, monkeypatch: pytest.MonkeyPatch):
    def timed_out(ref, timeout):
        raise GetTimeoutError("the model is still loading")

    monkeypatch.setattr(vllm_actor.ray, "get", timed_out)
    assert VLLM_ACTOR.meter(SETTINGS).count(request(256)) is None
