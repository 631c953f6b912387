"""Engine kinds: what the platform needs of one kind of engine, and the one registry of kinds.

An engine kind (an OpenAI-compatible server, vLLM's engine in a Ray actor) is a value that
satisfies `EngineKind`: its settings model (frozen pydantic, travels to Ray workers as a value),
the environment variables and secrets that supply it, and what the admission queue and the
dispatcher ask of an engine: how many turns it serves at once, which queue is its own, whether
turns are pinned to its slots, the client that streams a turn, the model turns are recorded with
and the run queue's tag. `KINDS` is read by the settings (`FleetSettings`: `FLEET_ENGINE_BACKEND`
and each kind's variables), the config (`EngineConfig`: `backend` and one section per kind), the
wiring and the admission queue; none of them names a kind.

Adding a kind: its module (its settings model and its `EngineKind`, importing no client at module
level: the settings import it), its client's module where it needs one (an `Engine`, `stream`),
and its line in `KINDS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel

from .openai_kind import OPENAI
from .settings import Variable
from .vllm_actor_kind import VLLM_ACTOR

if TYPE_CHECKING:
    from ..domain.tool_turns import Meter
    from .engine import Engine

S = TypeVar("S", bound=BaseModel)
AnyEngineSettings = BaseModel  # the settings of a registered kind (`kind_of` finds it)


class EngineKind(Protocol[S]):
    """What config, settings, wiring, the admission queue and the dispatcher need of one kind."""

    settings: type[S]  # its model, with a `tool_protocol` field; one per kind (`kind_of` finds it)
    description: str  # what `backend` means with it (config's description)
    variables: Mapping[str, Variable]  # fields of `settings` read from the environment
    secrets: Mapping[str, str]  # fields read through dg.EnvVar of these variables, never values

    def capacity(self, settings: S) -> int:
        """Turns the engine serves at once: the admission queue sends no more."""
        ...

    def label(self, settings: S) -> str:
        """Where the engine is: a bounded metrics label."""
        ...

    def queue_identity(self, settings: S) -> str:
        """The engine as its admission queue's name reads it: one queue per identity on the
        cluster, whichever run derives it."""
        ...

    def pins_slots(self, settings: S, capacity: int) -> bool:
        """Whether a turn is sent with the slot the queue granted it (its conversation's cache)."""
        ...

    def build(self, settings: S) -> Engine:
        """The client the admission queue streams turns with (in the queue's actor)."""
        ...

    def meter(self, settings: S) -> Meter | None:
        """The engine's window and its own count of a request, which tool turns fit their
        requests to; None when the engine reports none or fits requests itself."""
        ...

    def model_name(self, settings: S) -> str:
        """The model turns are recorded with (logs, metadata, metrics, evaluation fingerprints)."""
        ...

    def engine_id(self, settings: S) -> str:
        """The engine as a run tag value (`fleet/engine`): the run queue limits runs per engine."""
        ...


KINDS: dict[str, EngineKind[Any]] = {
    "openai": OPENAI,
    "vllm_actor": VLLM_ACTOR,
}
DEFAULT_KIND = "openai"


def backends() -> Any:
    """The type of a backend name: one of the registered kinds' (a Literal, for config's UI)."""
    return Literal[tuple(KINDS)]


def kind_of(settings: BaseModel) -> EngineKind[Any]:
    """The kind whose settings these are."""
    for kind in KINDS.values():
        if type(settings) is kind.settings:
            return kind
    raise TypeError(f"{type(settings).__name__} are the settings of no engine kind ({', '.join(KINDS)})")
