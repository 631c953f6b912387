"""Where agent turns run: the `turn_runner` resource.

The seam between the deliberation and the engine. A batch of `TurnRequest`s goes in; one
`TurnResult` per request comes back, in request order, by the deadline. A turn that fails or
misses the deadline is a result too (status failed / timeout), never an exception. Every phase
hands its turns over as one batch, so an engine that batches (llama.cpp slots, vLLM) sees them
together.

- `RayTurnRunner`: the stack's runner, the turns through the engine's admission queue on the Ray
  cluster (dispatch/admission.py: slots, earliest deadline first, streaming).
- Tests plug in a scripted runner (tests/scripted.py), so a whole deliberation runs without an
  engine or Ray.

Admission and streaming live behind `run_turns`; the assets see the batch, and give one
`TurnContext` (domain/deliberation.py): the deadline, the council's engine, for live progress
`on_chunk` as each turn's text streams and `on_result` as each turn ends, and the run's claim.
"""

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import partial

import dagster as dg
from dagster_ray import RayResource
from pydantic import Field, SecretStr

from ..domain.councils import EngineEntry
from ..domain.deliberation import TurnContext, TurnRunner
from ..domain.models import TurnRequest, TurnResult
from ..domain.tool_turns import Meter
from ..domain.tools import ToolProtocol
from ..llm.kinds import AnyEngineSettings, kind_of
from ..llm.settings import EngineSettings
from .config import EngineConfig


class TurnRunnerResource(dg.ConfigurableResource, ABC):
    """Runs batches of agent turns against the engine."""

    @property
    @abstractmethod
    def model_name(self) -> str:
        """The model name turns are recorded with (logs, metadata, evaluation fingerprints)."""

    @abstractmethod
    def run_turns(self, requests: Sequence[TurnRequest], turn: TurnContext) -> list[TurnResult]:
        """One result per request, in request order, under `turn`: its deadline (unfinished
        turns come back as TIMEOUT), its engine (None: the runner's), its progress callbacks and
        its claim (ignored by a runner without admission)."""

    def runner(self, turn: TurnContext) -> TurnRunner:
        """A `TurnRunner` (what the domain's algorithms take) bound to `turn` (`run_turns`)."""
        return partial(self.run_turns, turn=turn)

    def release_engine(self, run_id: str, engine: EngineEntry | None = None) -> None:
        """The run sends no more turns to the engine (its claim goes to the next run)."""

    def tool_protocol(self, engine: EngineEntry | None = None) -> ToolProtocol:
        """How agents call tools on the engine (`domain.tools`); `text` unless the engine says."""
        return "text"

    def meter(self, engine: EngineEntry | None = None) -> Meter | None:
        """The engine's window and its own count of a request (`domain.tool_turns.Meter`); None
        when the engine reports no window."""
        return None


class RayTurnRunner(TurnRunnerResource):
    """Turns on the Ray cluster, through the engine's admission queue actor
    (dispatch/admission.py, dispatch/ray_dispatch.py)."""

    engine: EngineConfig = Field(description="The engine every agent turn calls.")
    ray_cluster: dg.ResourceDependency[RayResource]
    num_cpus_per_turn: float = Field(
        default=0.05,
        description="Ray CPUs reserved by the engine's admission queue actor (and per evaluation task); "
        "turns are I/O-bound, so a fraction.",
    )
    max_worker_retries: int = Field(
        default=3, description="Resubmissions of turns lost when the admission queue actor died."
    )

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    def dispatch_settings(self):
        from ..dispatch.ray_dispatch import DispatchSettings

        return DispatchSettings(
            num_cpus_per_turn=self.num_cpus_per_turn, max_worker_retries=self.max_worker_retries
        )

    def run_turns(self, requests: Sequence[TurnRequest], turn: TurnContext) -> list[TurnResult]:
        from ..dispatch.ray_dispatch import RayTurnDispatcher

        settings = self.engine_settings(turn.engine)
        return RayTurnDispatcher(settings, self.dispatch_settings(), turn)(requests)

    def release_engine(self, run_id: str, engine: EngineEntry | None = None) -> None:
        import ray

        from ..dispatch.ray_dispatch import engine_queue

        settings = self.engine_settings(engine)
        # A release that fails is not the run's failure: the queue gives the claim up at the run's
        # deadline instead (later, never wrong).
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(engine_queue(settings, self.dispatch_settings()).release.remote(run_id))

    def tool_protocol(self, engine: EngineEntry | None = None) -> ToolProtocol:
        return self.engine_settings(engine).tool_protocol

    def meter(self, engine: EngineEntry | None = None) -> Meter | None:
        settings = self.engine_settings(engine)
        return kind_of(settings).meter(settings)

    def engine_settings(self, engine: EngineEntry | None) -> AnyEngineSettings:
        """The engine a run's turns go to: the council's own (`role_engine`), else the runner's."""
        return self.engine.to_model() if engine is None else self.role_engine(engine)

    def role_engine(self, engine: EngineEntry) -> EngineSettings:
        """The council's own engine: its URL, model, slots and API key; the stack's engine lends
        only how patiently it is called (timeouts, retries), where it has an OpenAI-compatible one."""
        key = os.environ.get(engine.api_key_env) if engine.api_key_env else None
        if engine.api_key_env and not key:
            raise dg.Failure(
                f"engine {engine.base_url}: its API key variable {engine.api_key_env} is not set",
                allow_retries=False,
            )
        lent = self.engine.openai.to_model().model_dump() if self.engine.openai is not None else {}
        return EngineSettings(
            **{
                **lent,
                "base_url": engine.base_url,
                "model": engine.model,
                "slots": engine.slots,
                "api_key": SecretStr(key) if key else None,
                **({"tool_protocol": engine.tool_protocol} if engine.tool_protocol else {}),
            }
        )
