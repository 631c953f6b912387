"""FleetSettings supplies values to the models the code runs with: each such setting is validated
and described by the field it supplies, so a bound or a description is written once."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleet_pipelines.domain.councils import CouncilSettings
from fleet_pipelines.events.options import ConnectOptions
from fleet_pipelines.llm.settings import EngineSettings, VLLMActorSettings
from fleet_pipelines.settings import FleetSettings

SUPPLIED = {
    "llm_base_url": (EngineSettings, "base_url"),
    "llm_model": (EngineSettings, "model"),
    "engine_slots": (EngineSettings, "slots"),
    "max_tokens": (CouncilSettings, "max_tokens"),
    "vllm_num_cpus": (VLLMActorSettings, "num_cpus"),
    "vllm_max_num_seqs": (VLLMActorSettings, "max_num_seqs"),
    "vllm_max_model_len": (VLLMActorSettings, "max_model_len"),
    "nats_url": (ConnectOptions, "url"),
}


@pytest.mark.parametrize(("setting", "target"), SUPPLIED.items())
def test_a_setting_is_described_and_bounded_by_the_field_it_supplies(setting, target):
    model, field = target
    mine, theirs = FleetSettings.model_fields[setting], model.model_fields[field]
    assert mine.description == theirs.description and mine.metadata == theirs.metadata


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("FLEET_ENGINE_SLOTS", "0", "greater than or equal to 1"),
        ("FLEET_MAX_TOKENS", "8", "greater than or equal to 16"),
        ("FLEET_VLLM_NUM_CPUS", "0", "greater than 0"),
        ("FLEET_VLLM_MAX_MODEL_LEN", "0", "greater than 0"),
    ],
)
def test_a_value_out_of_the_supplied_fields_bounds_is_refused_by_its_variable(variable, value, message):
    with pytest.raises(ValidationError, match=f"{variable}\n  Input should be {message}"):
        FleetSettings.from_env({variable: value})
