"""vLLM's engine held by a Ray actor as an engine kind (`llm.kinds`). Its settings are
`VLLMActorSettings`; its client, `vllm_actor.VLLMActorEngine`, is imported only where an engine is
built (it imports Ray; the settings import this module)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .settings import MODEL, TOOL_PROTOCOL, Variable, VLLMActorSettings

if TYPE_CHECKING:
    from .vllm_actor import VLLMActorEngine, VLLMActorMeter


class VLLMActorKind:
    settings = VLLMActorSettings
    description = "turns go to vLLM's engine in a named Ray actor (FLEET_VLLM_MODEL)"
    # Unset: the actor's own defaults.
    variables: Mapping[str, Variable] = {
        "model": Variable("FLEET_VLLM_MODEL"),
        "served_model_name": MODEL,
        "num_gpus": Variable("FLEET_VLLM_NUM_GPUS"),
        "num_cpus": Variable("FLEET_VLLM_NUM_CPUS"),
        "dtype": Variable("FLEET_VLLM_DTYPE"),
        "enforce_eager": Variable("FLEET_VLLM_ENFORCE_EAGER"),
        "cpu_kvcache_space_gib": Variable("FLEET_VLLM_CPU_KVCACHE_GIB"),
        "cache_root": Variable("FLEET_VLLM_CACHE_ROOT"),
        "max_num_seqs": Variable("FLEET_VLLM_MAX_NUM_SEQS"),
        "max_model_len": Variable("FLEET_VLLM_MAX_MODEL_LEN"),
        "tool_protocol": TOOL_PROTOCOL,
    }
    secrets: Mapping[str, str] = {}

    def capacity(self, settings: VLLMActorSettings) -> int:
        return settings.max_num_seqs

    def label(self, settings: VLLMActorSettings) -> str:
        return settings.actor_name()

    def queue_identity(self, settings: VLLMActorSettings) -> str:
        return settings.actor_name()  # a hash of every setting

    def pins_slots(self, settings: VLLMActorSettings, capacity: int) -> bool:
        return False  # vLLM shares cached prefixes across all requests by itself

    def build(self, settings: VLLMActorSettings) -> VLLMActorEngine:
        from .vllm_actor import VLLMActorEngine

        return VLLMActorEngine(settings)

    def meter(self, settings: VLLMActorSettings) -> VLLMActorMeter:
        from .vllm_actor import VLLMActorMeter

        return VLLMActorMeter.of(settings)

    def model_name(self, settings: VLLMActorSettings) -> str:
        return settings.served_model_name

    def engine_id(self, settings: VLLMActorSettings) -> str:
        return f"vllm-actor:{Path(settings.model).name}"


VLLM_ACTOR = VLLMActorKind()
