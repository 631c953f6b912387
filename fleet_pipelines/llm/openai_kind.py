"""An OpenAI-compatible server as an engine kind (`llm.kinds`): llama.cpp's server, vLLM's, Ray
Serve LLM. Its settings are `EngineSettings`; its client, `engine.ChatEngine`, is imported only
where an engine is built or asked (the settings import this module)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..domain.councils import engine_id
from .settings import MODEL, TOOL_PROTOCOL, EngineSettings, Variable

if TYPE_CHECKING:
    from .engine import ChatEngine, EngineMeter

DEFAULT_LLM_URL = "http://127.0.0.1:8080/v1"
DEFAULT_SLOTS = 4  # an OpenAI-compatible engine that does not say how many requests it serves at once


class OpenAIKind:
    settings = EngineSettings
    description = "turns call an OpenAI-compatible server over HTTP (llama.cpp, vLLM, Ray Serve)"
    variables: Mapping[str, Variable] = {
        "base_url": Variable("FLEET_LLM_BASE_URL", "VLLM_URL", default=DEFAULT_LLM_URL),
        "model": MODEL,
        "slots": Variable("FLEET_ENGINE_SLOTS"),
        "tool_protocol": TOOL_PROTOCOL,
    }
    secrets: Mapping[str, str] = {"api_key": "FLEET_LLM_API_KEY"}

    def capacity(self, settings: EngineSettings) -> int:
        """`slots`, else llama.cpp's own `/props`, else DEFAULT_SLOTS."""
        from .engine import llama_cpp_slots

        return settings.slots or llama_cpp_slots(settings.base_url) or DEFAULT_SLOTS

    def label(self, settings: EngineSettings) -> str:
        from .engine import normalize_base_url

        return normalize_base_url(settings.base_url)

    def queue_identity(self, settings: EngineSettings) -> str:
        return f"{self.label(settings)}:{settings.model}"

    def pins_slots(self, settings: EngineSettings, capacity: int) -> bool:
        """Slot ids go only to llama.cpp (`id_slot`), whose slots they are, and only when it has
        every slot the queue grants."""
        from .engine import llama_cpp_slots

        return (llama_cpp_slots(settings.base_url) or 0) >= capacity

    def build(self, settings: EngineSettings) -> ChatEngine:
        from .engine import ChatEngine

        return ChatEngine(settings)

    def meter(self, settings: EngineSettings) -> EngineMeter | None:
        from .engine import EngineMeter

        return EngineMeter.of(settings)

    def model_name(self, settings: EngineSettings) -> str:
        return settings.model

    def engine_id(self, settings: EngineSettings) -> str:
        return engine_id(settings.base_url)


OPENAI = OpenAIKind()
