"""A toy engine kind, added the way docs/design.md says a kind is added: this module (its
settings, its `EngineKind` and, being light, its client too) and one line in `llm.kinds.KINDS`,
which tests/integration/test_engine_kinds.py writes in a fresh interpreter before the code
location reads the registry. Its turns take `delay_s` and say which turn they answer; the client
counts how many run at once."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from fleet_pipelines.domain.tools import ToolProtocol
from fleet_pipelines.llm.settings import MODEL, TOOL_PROTOCOL, Variable

if TYPE_CHECKING:  # the client's module (openai) is imported where a turn is streamed
    from fleet_pipelines.llm.engine import ChatCall, Completion, OnText


class ToySettings(BaseModel):
    """A toy engine: its model's name, how many turns it serves at once, how long one takes."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(min_length=1, description="Model name turns are recorded with.")
    slots: int = Field(default=2, ge=1, description="Turns the toy serves at once.")
    delay_s: float = Field(default=0.05, ge=0, description="How long a turn takes.")
    token: SecretStr | None = Field(default=None, description="The toy's token.")
    tool_protocol: ToolProtocol = Field(default="text", description="How agents call tools with it.")


class ToyEngine:
    """Answers each call after `delay_s`; `peak` is the most calls it held at once."""

    running: ClassVar[int] = 0
    peak: ClassVar[int] = 0

    def __init__(self, settings: ToySettings):
        self.settings = settings

    async def stream(self, call: ChatCall, on_text: OnText | None = None) -> Completion:
        from fleet_pipelines.llm.engine import Completion

        ToyEngine.running += 1
        ToyEngine.peak = max(ToyEngine.peak, ToyEngine.running)
        try:
            await asyncio.sleep(self.settings.delay_s)
        finally:
            ToyEngine.running -= 1
        text = f"toy answers {call.messages[-1].content}"
        if on_text is not None:
            on_text(text)
        return Completion(text, self.settings.model, 1, 1, self.settings.delay_s * 1000, 0.0, 1)


class ToyKind:
    settings = ToySettings
    description = "turns go to the toy engine"
    variables: Mapping[str, Variable] = {
        "model": MODEL,
        "slots": Variable("FLEET_TOY_SLOTS"),
        "delay_s": Variable("FLEET_TOY_DELAY_S"),
        "tool_protocol": TOOL_PROTOCOL,
    }
    secrets: Mapping[str, str] = {"token": "FLEET_TOY_TOKEN"}

    def capacity(self, settings: ToySettings) -> int:
        return settings.slots

    def label(self, settings: ToySettings) -> str:
        return f"toy:{settings.model}"

    def queue_identity(self, settings: ToySettings) -> str:
        return f"toy:{settings.model}:{settings.delay_s}"

    def pins_slots(self, settings: ToySettings, capacity: int) -> bool:
        return False

    def build(self, settings: ToySettings) -> ToyEngine:
        return ToyEngine(settings)

    def meter(self, settings: ToySettings) -> None:
        return None

    def model_name(self, settings: ToySettings) -> str:
        return settings.model

    def engine_id(self, settings: ToySettings) -> str:
        return f"toy:{settings.model}"


TOY = ToyKind()
