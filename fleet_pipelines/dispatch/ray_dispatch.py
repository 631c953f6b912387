"""Agent turns on Ray, through the admission queue of their engine (`dispatch.admission`).

A batch of turns is submitted to the engine's `EngineQueue` actor (named, detached, shared by
every run on the cluster, created on first use) and the run long-polls it: text chunks go to the
`TurnContext`'s `on_chunk` as they stream, each result to its `on_result` as soon as its turn
ends, and the batch returns in request order. The actor's name carries a hash of the project's
source, so new code gets a new queue. An actor process that dies is restarted by Ray; turns it
lost are submitted again (`max_worker_retries`). Turns still unfinished at the deadline (plus a
grace for the actor to report its own TIMEOUT) are abandoned, which closes their streams.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayError

from ..domain.deliberation import TurnContext
from ..domain.models import TurnRequest, TurnResult, TurnStatus
from .admission import AnyEngineSettings, EngineQueue, Submission, TurnNews, queue_name

WORKER_NAMESPACE = "fleet"


@cache
def code_version() -> str:
    """A hash of the package's source: queues started by older code are never reused."""
    digest = hashlib.sha1()
    for path in sorted(Path(__file__).resolve().parent.parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class DispatchSettings:
    num_cpus_per_turn: float = 0.05  # CPU of the queue actor (and of each Ray task of a fan-out)
    max_worker_retries: int = 3  # resubmissions of turns lost with a dead queue actor
    max_concurrency: int = 1024  # calls the queue actor takes at once (polls included)
    chunk_interval_s: float = 0.3  # a few chunks per second per turn, not one message per token
    poll_s: float = 1.0  # longest a poll waits for news
    lease_s: float = 60.0  # a turn nobody polls this long is abandoned (its run died)
    capacity: int | None = None  # engine slots; None: the engine's own (llama.cpp /props, vLLM)
    # A queue that has held nothing and been asked nothing this long ends (the next run starts it
    # again): the queue of an engine no run uses any more, or of older code after a deploy, would
    # otherwise keep its Ray worker on a long-lived cluster.
    idle_exit_s: float = 900.0


def engine_queue(engine: AnyEngineSettings, settings: DispatchSettings) -> ray.actor.ActorHandle:
    """The admission queue of `engine` on the connected cluster, created by the first caller.
    It answers `ready` before this returns, so it does not end idle while the caller uses it."""
    name = queue_name(engine, settings.capacity, code_version())
    tries = 3
    while True:
        queue = _create_engine_queue(name, engine, settings)
        try:
            ray.get(queue.ready.remote())
            return queue
        except ActorDiedError:
            # It ended idle as this caller found it: the next try starts it again.
            tries -= 1
            if tries == 0:
                raise
            time.sleep(0.5)
        except Exception as exc:
            # Through Ray Client, get_if_exists is not atomic: two runs starting at once both
            # create the actor and the loser's handle fails on first use, the name being taken.
            # The winner's queue serves both; any other failure is raised as it came.
            try:
                queue = ray.get_actor(name, namespace=WORKER_NAMESPACE)
            except ValueError:
                raise exc from None
            ray.get(queue.ready.remote())
            return queue


def _create_engine_queue(
    name: str, engine: AnyEngineSettings, settings: DispatchSettings
) -> ray.actor.ActorHandle:
    return (
        ray.remote(EngineQueue)
        .options(
            name=name,
            namespace=WORKER_NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=settings.num_cpus_per_turn,
            max_concurrency=settings.max_concurrency,
            max_restarts=-1,
            max_task_retries=settings.max_worker_retries,
        )
        .remote(
            engine,
            settings.capacity,
            settings.chunk_interval_s,
            settings.lease_s,
            idle_exit_s=settings.idle_exit_s,
            on_idle=_end_this_actor,
        )
    )


def _end_this_actor() -> None:
    """Ends the calling actor for good (not restarted; its name is free for the next run)."""
    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


@dataclass
class _Batch:
    """One call's turns as the dispatcher follows them through the queue."""

    requests: dict[str, TurnRequest]  # by turn id, in request order
    given: float  # the deadline the run gave (inf for none)
    deadline: float  # as the queue keeps it: moved by the run's time in reserve
    results: dict[str, TurnResult] = field(default_factory=dict)
    retries: int = 0  # Ray failures and actor restarts so far
    # chunks read from the actor (back to 0 when a turn runs again) and chunks handed to on_chunk
    # (never back: they index the stream)
    cursors: dict[str, int] = field(default_factory=dict)
    emitted: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, requests: Sequence[TurnRequest], given: float, deadline: float) -> _Batch:
        by_id = {uuid.uuid4().hex: r for r in requests}
        return cls(by_id, given, deadline, cursors=dict.fromkeys(by_id, 0), emitted=dict.fromkeys(by_id, 0))

    def pending(self) -> dict[str, int]:
        """The turns without a result yet, with their cursors."""
        return {i: self.cursors[i] for i in self.requests if i not in self.results}

    def submissions(self, turn_ids: Sequence[str]) -> list[Submission]:
        return [Submission(i, self.requests[i], self.given) for i in turn_ids]


class RayTurnDispatcher:
    """Runs batches of turns on `engine` (the settings of `turn.engine`, else the stack's)
    through its admission queue, under `turn`: its wall-clock deadline, progress and claim."""

    def __init__(self, engine: AnyEngineSettings, settings: DispatchSettings, turn: TurnContext):
        self.engine = engine
        self.settings = settings
        self.turn = turn

    def __call__(self, requests: Sequence[TurnRequest]) -> list[TurnResult]:
        """Submits the batch, polls until every turn has its result (or the deadline or Ray gives
        out), and abandons what is left."""
        if not requests:
            return []
        given = math.inf if self.turn.deadline is None else self.turn.deadline
        # Only a run with a claim asks the queue first: its deadline moved while it was in reserve.
        queue = None if self.turn.claim is None else engine_queue(self.engine, self.settings)
        deadline = given if queue is None else self._deadline(queue, given)
        if deadline <= time.time():
            return [
                self._finished(self._cut(r, "deadline passed before the turn was queued")) for r in requests
            ]
        if queue is None:
            queue = engine_queue(self.engine, self.settings)
        batch = _Batch.of(requests, given, deadline)
        try:
            ray.get(queue.submit.remote(batch.submissions(list(batch.requests)), self.turn.claim))
            while batch.pending() and self._poll(queue, batch):
                pass
        finally:
            if unfinished := list(batch.pending()):
                queue.abandon.remote(unfinished)  # closes their streams; nobody waits for the answer
        return [batch.results[i] for i in batch.requests]

    def _poll(self, queue: ray.actor.ActorHandle, batch: _Batch) -> bool:
        """One poll of the queue and what its news brings; False once the batch is given up (past
        its deadline, or Ray failed too often), each pending turn then with its result."""
        if self._overdue(queue, batch):  # the actor should have reported them; it did not in time
            self._give_up(batch, lambda r: self._cut(r, "deliberation deadline reached"))
            return False
        try:
            news: dict[str, TurnNews] = ray.get(
                queue.poll.remote(batch.pending(), self.settings.poll_s), timeout=self.settings.poll_s + 60
            )
        except (RayError, GetTimeoutError) as exc:
            batch.retries += 1
            if batch.retries <= self.settings.max_worker_retries:
                return True
            why, kind = f"Ray could not run the turn: {exc}", type(exc).__name__
            self._give_up(batch, lambda r: TurnResult.unfinished(r, TurnStatus.FAILED, why, kind))
            return False
        self._resubmit_lost(queue, batch, [i for i, n in news.items() if not n.known])
        for turn_id, turn_news in news.items():
            self._take(batch, turn_id, turn_news)
        return True

    def _overdue(self, queue: ray.actor.ActorHandle, batch: _Batch) -> bool:
        """Past the deadline with room for the actor to report its own TIMEOUT, the deadline asked
        again first (it moved while its run was in reserve)."""
        if time.time() > batch.deadline + 10 * self.settings.poll_s:
            with contextlib.suppress(RayError, GetTimeoutError):  # else: as it was
                batch.deadline = self._deadline(queue, batch.given)
        return time.time() > batch.deadline + 10 * self.settings.poll_s

    def _resubmit_lost(self, queue: ray.actor.ActorHandle, batch: _Batch, lost: list[str]) -> None:
        """Turns the actor does not know (it was restarted) run again, read from their start."""
        if not lost:
            return
        batch.retries += 1
        ray.get(queue.submit.remote(batch.submissions(lost), self.turn.claim))
        for turn_id in lost:
            batch.cursors[turn_id] = 0

    def _take(self, batch: _Batch, turn_id: str, news: TurnNews) -> None:
        """A turn's news: its chunks to `on_chunk`, its result to `on_result`."""
        for text, pieces in news.chunks:
            if self.turn.on_chunk is not None:
                self.turn.on_chunk(batch.requests[turn_id], batch.emitted[turn_id], text, pieces)
            batch.cursors[turn_id] += 1
            batch.emitted[turn_id] += 1
        if news.result is not None:
            batch.results[turn_id] = self._finished(news.result)

    def _give_up(self, batch: _Batch, result_of: Callable[[TurnRequest], TurnResult]) -> None:
        for turn_id in batch.pending():
            batch.results[turn_id] = self._finished(result_of(batch.requests[turn_id]))

    def _deadline(self, queue: ray.actor.ActorHandle, given: float) -> float:
        """The deadline as the queue keeps it for this run (moved by its time in reserve)."""
        if self.turn.claim is None or math.isinf(given):
            return given
        return ray.get(queue.deadline_of.remote(self.turn.claim.run_id, given))

    def _finished(self, result: TurnResult) -> TurnResult:
        if self.turn.on_result is not None:
            self.turn.on_result(result)
        return result

    @staticmethod
    def _cut(request: TurnRequest, why: str) -> TurnResult:
        return TurnResult.unfinished(request, TurnStatus.TIMEOUT, why, "Timeout")
