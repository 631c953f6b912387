"""Agent turns as Ray tasks.

A turn is I/O-bound (it waits on the engine), so each task reserves a small fraction of a CPU:
3 agents on a 2-core head run at once instead of queueing for whole cores. Ray re-runs a turn
whose worker process died (`max_retries`); engine errors are retried inside the turn with backoff
and come back as failed results, never as exceptions that would sink the whole batch. Turns still
running at the deliberation deadline are cancelled and reported as TIMEOUT.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import ray
from ray.exceptions import RayError

from ..domain.models import TurnRequest, TurnResult, TurnStatus
from ..llm.engine import ChatEngine, EngineError, EngineSettings
from ..llm.vllm_actor import VLLMActorEngine, VLLMActorSettings

# The backend follows the settings' type: an OpenAI-compatible server, or the vLLM engine actor.
AnyEngineSettings = EngineSettings | VLLMActorSettings
_engines: dict[AnyEngineSettings, ChatEngine | VLLMActorEngine] = {}


def run_turn(settings: AnyEngineSettings, request: TurnRequest) -> TurnResult:
    """One agent turn against the engine; runs inside a Ray worker (or inline in tests)."""
    engine = _engines.get(settings)
    if engine is None:
        engine = _engines[settings] = (
            VLLMActorEngine(settings) if isinstance(settings, VLLMActorSettings) else ChatEngine(settings)
        )
    start = time.perf_counter()
    try:
        completion = engine.complete(
            request.messages, request.temperature, request.max_tokens, request.response_schema
        )
    except EngineError as exc:
        failed = TurnResult.unfinished(request, TurnStatus.FAILED, str(exc), exc.kind)
        return failed.model_copy(
            update={"latency_ms": (time.perf_counter() - start) * 1000, "attempts": exc.attempts}
        )
    status = TurnStatus.COMPLETED if completion.content.strip() else TurnStatus.FAILED
    return TurnResult(
        task_id=request.task_id,
        agent_id=request.agent_id,
        role=request.role,
        kind=request.kind,
        round=request.round,
        target_agent_id=request.target_agent_id,
        status=status,
        content=completion.content,
        model=completion.model,
        temperature=request.temperature,
        tokens_in=completion.tokens_in,
        tokens_out=completion.tokens_out,
        latency_ms=completion.latency_ms,
        attempts=completion.attempts,
        error=None if status is TurnStatus.COMPLETED else "engine returned an empty completion",
        error_type=None if status is TurnStatus.COMPLETED else "EmptyCompletion",
    )


_remote_turn = ray.remote(run_turn)


@dataclass(frozen=True)
class DispatchSettings:
    num_cpus_per_turn: float = 0.05
    max_worker_retries: int = 3


class RayTurnDispatcher:
    """Runs batches of turns on the connected Ray cluster, honouring a wall-clock deadline."""

    def __init__(self, engine: AnyEngineSettings, settings: DispatchSettings, deadline: float | None = None):
        self.engine = engine
        self.settings = settings
        self.deadline = deadline  # time.time() at which unfinished turns are cut off

    def __call__(self, requests: Sequence[TurnRequest]) -> list[TurnResult]:
        if not requests:
            return []
        remaining = None if self.deadline is None else self.deadline - time.time()
        if remaining is not None and remaining <= 0:
            return [self._timeout(r) for r in requests]
        task = _remote_turn.options(
            num_cpus=self.settings.num_cpus_per_turn,
            max_retries=self.settings.max_worker_retries,
            retry_exceptions=False,
        )
        engine_ref = ray.put(self.engine)
        refs = [task.remote(engine_ref, r) for r in requests]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=remaining)
        ready_set = set(ready)
        results = []
        for ref, request in zip(refs, requests, strict=True):
            if ref not in ready_set:
                ray.cancel(ref, force=True)
                results.append(self._timeout(request))
                continue
            try:
                results.append(ray.get(ref))
            except RayError as exc:
                results.append(
                    TurnResult.unfinished(
                        request, TurnStatus.FAILED, f"Ray could not run the turn: {exc}", type(exc).__name__
                    )
                )
        return results

    def _timeout(self, request: TurnRequest) -> TurnResult:
        return TurnResult.unfinished(
            request, TurnStatus.TIMEOUT, "deliberation deadline reached before the turn finished", "Timeout"
        )
