"""Where agent turns run: the `turn_runner` resource.

The seam between the deliberation and the engine. A batch of `TurnRequest`s goes in; one
`TurnResult` per request comes back, in request order, by the deadline. A turn that fails or
misses the deadline is a result too (status failed / timeout), never an exception. Every phase
hands its turns over as one batch, so an engine that batches (llama.cpp slots, vLLM) sees them
together.

- `RayTurnRunner`: the stack's runner, the turns on the Ray cluster's worker actors.
- Tests plug in a scripted runner (tests/scripted.py), so a whole deliberation runs without an
  engine or Ray.

Admission, streaming and progress belong behind `run_turns`; the assets see only the batch.
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import partial

import dagster as dg
from dagster_ray import RayResource
from pydantic import Field

from ..domain.councils import EngineEntry
from ..domain.deliberation import TurnRunner
from ..domain.models import TurnRequest, TurnResult
from .config import EngineConfig


class TurnRunnerResource(dg.ConfigurableResource, ABC):
    """Runs batches of agent turns against the engine."""

    @property
    @abstractmethod
    def model_name(self) -> str:
        """The model name turns are recorded with (logs, metadata, evaluation fingerprints)."""

    @abstractmethod
    def run_turns(
        self, requests: Sequence[TurnRequest], deadline: float | None, engine: EngineEntry | None = None
    ) -> list[TurnResult]:
        """One result per request, in request order. `deadline` is a time.time() after which
        unfinished turns come back as TIMEOUT; None for no deadline. `engine`: the council's own
        engine (councils file); None for the runner's."""

    def runner(self, deadline: float | None, engine: EngineEntry | None = None) -> TurnRunner:
        """A `TurnRunner` (what the domain's algorithms take) bound to a deadline and an engine."""
        return partial(self.run_turns, deadline=deadline, engine=engine)


class RayTurnRunner(TurnRunnerResource):
    """Turns on the Ray cluster: warm, threaded worker actors calling the engine
    (dispatch/ray_dispatch.py)."""

    engine: EngineConfig = Field(description="The engine every agent turn calls.")
    ray_cluster: dg.ResourceDependency[RayResource]
    num_cpus_per_turn: float = Field(
        default=0.05, description="Ray CPUs reserved per worker actor; turns are I/O-bound, so a fraction."
    )
    max_worker_retries: int = Field(default=3, description="Ray re-runs of a turn whose worker process died.")

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    def dispatch_settings(self):
        from ..dispatch.ray_dispatch import DispatchSettings

        return DispatchSettings(
            num_cpus_per_turn=self.num_cpus_per_turn, max_worker_retries=self.max_worker_retries
        )

    def run_turns(
        self, requests: Sequence[TurnRequest], deadline: float | None, engine: EngineEntry | None = None
    ) -> list[TurnResult]:
        from ..dispatch.ray_dispatch import RayTurnDispatcher

        settings = self.engine.to_model()
        if engine is not None:  # the council's engine, called like the stack's OpenAI-compatible one
            settings = self.engine.openai.to_model().model_copy(
                update={"base_url": engine.base_url, "model": engine.model}
            )
        return RayTurnDispatcher(settings, self.dispatch_settings(), deadline)(requests)
