"""An engine kind is its module and one line in the registry (`llm.kinds.KINDS`): each kind is
found by its settings. A toy kind (tests/toy_engine.py) added that way, in a fresh interpreter, is
read by the settings, the wiring, the config and the admission queue:
tests/integration/test_engine_kinds.py."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from fleet_pipelines.llm.kinds import KINDS, kind_of
from fleet_pipelines.llm.openai_kind import OPENAI
from fleet_pipelines.llm.settings import EngineSettings, VLLMActorSettings
from fleet_pipelines.llm.vllm_actor_kind import VLLM_ACTOR


def test_a_kind_is_found_by_its_settings():
    assert kind_of(EngineSettings(base_url="http://127.0.0.1:9/v1", model="m")) is OPENAI
    assert kind_of(VLLMActorSettings(model="/models/m", served_model_name="m")) is VLLM_ACTOR
    assert list(KINDS.values()) == [OPENAI, VLLM_ACTOR]

    class Elsewhere(BaseModel):
        model: str = "m"

    with pytest.raises(TypeError, match="Elsewhere are the settings of no engine kind"):
        kind_of(Elsewhere())
