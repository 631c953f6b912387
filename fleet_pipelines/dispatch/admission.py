"""Admission per engine: one named Ray actor per engine owns its slots for the whole cluster.

The engine is the scarce resource. Every turn of every run connected to the cluster goes through
the `EngineQueue` actor of its engine, which sends a turn only when the engine has a free slot
(its kind's capacity, `llm.kinds`: `EngineSettings.slots`, llama.cpp's own `/props`, or vLLM's
`max_num_seqs`). Which turn gets a slot, when a turn is refused, which run holds the engine and
which waits in reserve, and when a background turn gives its slot back is the policy of
`scheduler.Scheduler` (synchronous, tested without Ray); this module is the mechanism around it.

The actor runs the turns (asyncio, one process, I/O-bound): each waits on a future the
scheduler's `Grant` or `Refusal` resolves, and a `TakeBack` cancels a background turn's engine
call, which then waits again. Waiting is never a failure: the engine clocks (first token, idle)
start when a turn is sent. The actor keeps each turn's text as chunks, cut every
`chunk_interval_s`, which the run long-polls (`poll`). Ray Client (`ray://`) cannot carry
streaming generators, so a poll is how tokens reach a run through the production path as well;
the run publishes them, workers stay free of NATS. A turn the run stops polling for `lease_s`
(the run died) or abandons is cancelled, which closes its stream so the engine stops generating
for it. A run releases the engine when its last turns (the judges) are back (`release`). The run
queue lets one more run per engine start than hold it (dagster.yaml): that run's start, its
first steps and its proposals overlap the holder's checks, decision and end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..domain.deliberation import Claim
from ..domain.models import TurnRequest, TurnResult, TurnStatus
from ..llm.engine import ChatCall, Engine, EngineError
from ..llm.kinds import AnyEngineSettings, kind_of
from ..llm.openai_kind import DEFAULT_SLOTS as DEFAULT_SLOTS  # benchmarks/load.py reads it here
from .queue_metrics import QueueMetrics
from .scheduler import (
    NOTES,
    Closed,
    Decision,
    Ended,
    Event,
    Grant,
    Polled,
    Released,
    Scheduler,
    Sent,
    Submitted,
    TakeBack,
    Tick,
    TurnSpec,
    Waiting,
    Withdrawn,
)

NOT_STARTED = "NotStarted"  # error_type of a turn reported TIMEOUT without being sent


def make_engine(engine: AnyEngineSettings) -> Engine:
    """The client of the engine these settings are of (its kind's, `llm.kinds`)."""
    return kind_of(engine).build(engine)


async def execute_turn(
    engine: Engine,
    request: TurnRequest,
    deadline: float = math.inf,
    on_text=None,
    slot: int | None = None,
) -> TurnResult:
    """Sends one turn and streams its reply; past `deadline` (time.time()) the stream is closed and
    the turn is TIMEOUT. Engine errors come back as FAILED results, never as exceptions. `slot`:
    the engine slot to decode it in (llama.cpp), None to leave it to the engine."""
    start = time.perf_counter()
    streamed: list[str] = []

    def collect(text: str) -> None:
        streamed.append(text)
        if on_text is not None:
            on_text(text)

    try:
        async with asyncio.timeout(None if math.isinf(deadline) else deadline - time.time()):
            completion = await engine.stream(ChatCall.for_request(request, slot), collect)
    except TimeoutError:
        result = TurnResult.unfinished(
            request,
            TurnStatus.TIMEOUT,
            f"deadline reached while generating ({len(streamed)} chunks streamed); stream closed",
            "Timeout",
        )
        return result.model_copy(
            update={
                "latency_ms": (time.perf_counter() - start) * 1000,
                "attempts": 1,
                "content": "".join(streamed),
            }
        )
    except EngineError as exc:
        failed = TurnResult.unfinished(request, TurnStatus.FAILED, str(exc), exc.kind)
        return failed.model_copy(
            update={"latency_ms": (time.perf_counter() - start) * 1000, "attempts": exc.attempts}
        )
    status = TurnStatus.COMPLETED if completion.content.strip() else TurnStatus.FAILED
    return TurnResult.for_request(
        request,
        status,
        content=completion.content,
        model=completion.model,
        tokens_in=completion.tokens_in,
        tokens_out=completion.tokens_out,
        tokens_cached=completion.tokens_cached,
        latency_ms=completion.latency_ms,
        first_token_ms=completion.first_token_ms,
        attempts=completion.attempts,
        error=None if status is TurnStatus.COMPLETED else "engine returned an empty completion",
        error_type=None if status is TurnStatus.COMPLETED else "EmptyCompletion",
    )


@dataclass(frozen=True)
class Submission:
    """A turn a run hands the queue: its id (the run's), its request and its deadline (time.time(),
    inf for none)."""

    turn_id: str
    request: TurnRequest
    deadline: float


Chunk = tuple[str, int]  # (text, pieces of streamed text in it)


@dataclass(frozen=True)
class TurnNews:
    """What a poll tells a run of one turn: the chunks after its cursor and its result once it has
    one. `known` is False for a turn the actor does not hold (it was restarted): submit it again."""

    known: bool
    chunks: tuple[Chunk, ...] = ()
    result: TurnResult | None = None


@dataclass
class _Turn:
    """A turn as the actor runs it: its task, its engine call and what it streamed."""

    turn_id: str
    request: TurnRequest
    submitted: float
    chunks: list[Chunk] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    flushed_at: float = 0.0
    last_poll: float = 0.0
    finished_at: float | None = None
    result: TurnResult | None = None
    task: asyncio.Task | None = None
    run_id: str | None = None  # the run whose claim it came with
    grant: asyncio.Future | None = None  # while it waits: resolved by the scheduler's decision
    slot: int | None = None  # the engine slot granted to it
    slot_reused: bool = False  # that slot held its conversation (llama.cpp reads it from cache)
    attempt: asyncio.Task | None = None  # its engine call, while it has a slot


class EngineQueue:
    """The admission queue and turn runner of one engine (a named, detached, async Ray actor).

    The mechanism: futures, polls, streaming and reaping. What to send when is the
    `scheduler.Scheduler`'s; the actor tells it what happens and applies its decisions."""

    def __init__(
        self,
        engine: AnyEngineSettings,
        capacity: int | None = None,
        chunk_interval_s: float = 0.3,
        lease_s: float = 60.0,
        finished_keep_s: float = 300.0,
        idle_exit_s: float = math.inf,
        on_idle: Callable[[], None] | None = None,
    ):
        """`on_idle` is called once the queue has held nothing (`Scheduler.idle`) and been asked
        nothing for `idle_exit_s`: the Ray actor ends itself there (`ray_dispatch`)."""
        self.engine_settings = engine
        kind = kind_of(engine)
        self.capacity = capacity or kind.capacity(engine)
        self.chunk_interval_s = chunk_interval_s
        self.lease_s = lease_s
        self.finished_keep_s = finished_keep_s
        self.idle_exit_s = idle_exit_s
        self.on_idle = on_idle
        self._asked_at = time.time()  # the last call of any run
        self.scheduler = Scheduler(self.capacity, time.time, kind.pins_slots(engine, self.capacity), lease_s)
        self._engine = None
        self._turns: dict[str, _Turn] = {}
        self._changed: asyncio.Event | None = None
        self._reaper: asyncio.Task | None = None
        self.counts = {"sent": 0, "not_started": 0, "abandoned": 0, "preempted": 0, "background_sent": 0}
        self.metrics = QueueMetrics(kind.label(engine), kind.model_name(engine))
        self._record_state()

    @property
    def pin_slots(self) -> bool:
        return self.scheduler.pin_slots

    # -- the run's side --------------------------------------------------------------------------

    async def submit(self, turns: list[Submission], claim: Claim | None = None) -> None:
        """Queues the turns; returns at once. `claim`: that of the run they belong to (see
        `scheduler`)."""
        self._asked()
        now = time.time()
        run_id = None if claim is None else claim.run_id
        new: dict[str, Submission] = {}
        for submitted in turns:
            if submitted.turn_id not in self._turns:  # else: a resubmission the actor already holds
                new.setdefault(submitted.turn_id, submitted)
        specs = tuple(
            TurnSpec(s.turn_id, s.request.kind, s.request.conversation, s.deadline, run_id)
            for s in new.values()
        )
        self._tell(Submitted(specs, claim, max((t.deadline for t in turns), default=0.0)))
        for submitted in new.values():
            turn = _Turn(
                submitted.turn_id,
                submitted.request,
                submitted=now,
                flushed_at=now,
                last_poll=now,
                run_id=run_id,
            )
            self._turns[turn.turn_id] = turn
            turn.task = asyncio.create_task(self._run(turn))

    async def ready(self) -> None:
        """A run is about to use the queue (`ray_dispatch.engine_queue`): it stays up."""
        self._asked()

    async def release(self, run_id: str) -> None:
        """The run sends no more turns: the engine goes to the reserve."""
        self._asked()
        self._tell(Released(run_id))

    async def deadline_of(self, run_id: str, deadline: float) -> float:
        """A deadline of this run as the queue keeps it: moved by the run's time in reserve."""
        self._asked()
        return self.scheduler.deadline_of(run_id, deadline)

    async def poll(self, cursors: dict[str, int], wait_s: float) -> dict[str, TurnNews]:
        """The news of these turns (by turn id: the chunks after its cursor, its result), for those
        that have any; waits up to `wait_s` for some. A turn this actor does not know (it was
        restarted) comes back not `known`."""
        self._asked()
        deadline = time.monotonic() + wait_s
        while True:
            changed = self._event()
            now = time.time()
            out = {}
            for turn_id, cursor in cursors.items():
                turn = self._turns.get(turn_id)
                if turn is None:
                    out[turn_id] = TurnNews(known=False)
                    continue
                turn.last_poll = now
                self._tell(Polled(turn.run_id))
                if turn.chunks[cursor:] or turn.result is not None:
                    out[turn_id] = TurnNews(True, tuple(turn.chunks[cursor:]), turn.result)
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def abandon(self, turn_ids: list[str]) -> int:
        """Cancels these turns: waiting ones leave the queue, running ones close their stream."""
        cancelled = 0
        for turn_id in turn_ids:
            turn = self._turns.pop(turn_id, None)
            if turn is None:
                continue
            self._tell(Closed(turn_id))
            if turn.task is not None and not turn.task.done():
                turn.task.cancel()
                cancelled += 1
        self.counts["abandoned"] += cancelled
        self._record_state()
        return cancelled

    def stats(self) -> dict[str, Any]:
        return {**self.scheduler.stats(), **self.counts}

    # -- inside the actor ------------------------------------------------------------------------

    def _asked(self) -> None:
        self._asked_at = time.time()
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap())

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify(self) -> None:
        self._event().set()
        self._changed = asyncio.Event()

    def _tell(self, event: Event) -> None:
        """Tells the scheduler what happened and carries out the decisions it answers with."""
        decisions = self.scheduler.handle(event)
        if not isinstance(event, NOTES):  # a note is answered with none; its callers record the state
            self._apply(decisions)

    def _apply(self, decisions: list[Decision]) -> None:
        """Carries the scheduler's decisions out: grants and refusals resolve the waiting turns'
        futures, a take-back cancels a background turn's engine call."""
        for decision in decisions:
            turn = self._turns.get(decision.turn_id)
            if isinstance(decision, TakeBack):
                if turn is not None and turn.attempt is not None:
                    turn.attempt.cancel()
            elif turn is None or turn.grant is None or turn.grant.done():
                if isinstance(decision, Grant):  # nobody waits for it any more: the next turn's
                    self._tell(Withdrawn(decision.turn_id))
            elif isinstance(decision, Grant):
                turn.slot, turn.slot_reused = decision.slot, decision.reused
                turn.grant.set_result(None)
            else:
                turn.grant.set_result(decision.reason)
        self._record_state()

    def _record_state(self) -> None:
        running, waiting = self.scheduler.occupancy()
        self.metrics.state(self.capacity, running, waiting)

    async def _admit(self, turn: _Turn) -> str | None:
        """None once the turn holds a slot; otherwise why it will not be sent."""
        grant = turn.grant = asyncio.get_running_loop().create_future()
        try:
            self._tell(Waiting(turn.turn_id))
            while not grant.done():  # looked at again: a reserve run's deadline starts later
                left = self.scheduler.deadline(turn.turn_id) - time.time()
                if left <= 0:
                    raise TimeoutError
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(grant), min(left, 5.0))
        except (TimeoutError, asyncio.CancelledError) as exc:
            # Leaves the queue; a slot granted in the same instant goes to the next turn.
            self._tell(Withdrawn(turn.turn_id))
            if isinstance(exc, asyncio.CancelledError):
                raise
            waited = time.time() - turn.submitted
            return f"not sent: no free engine slot before the deadline (waited {waited:.0f} s)"
        finally:
            turn.grant = None
        return grant.result()

    async def _run(self, turn: _Turn) -> None:
        request = turn.request
        while True:
            refused = await self._admit(turn)
            queue_ms = (time.time() - turn.submitted) * 1000
            if refused is not None:
                self.counts["not_started"] += 1
                self.metrics.refused_turn(request.kind)
                result = TurnResult.unfinished(request, TurnStatus.TIMEOUT, refused, NOT_STARTED)
                self._finish(turn, result.model_copy(update={"queue_ms": queue_ms}))
                return
            self.counts["sent"] += 1
            self.metrics.admitted_turn(request.kind, queue_ms / 1000)
            self.counts["background_sent"] += self.scheduler.background(turn.turn_id)
            result = None
            taken_back = False
            try:
                if self._engine is None:
                    self._engine = make_engine(self.engine_settings)
                turn.attempt = asyncio.create_task(
                    execute_turn(
                        self._engine,
                        request,
                        self.scheduler.deadline(turn.turn_id),  # none for a background turn yet
                        lambda text: self._text(turn, text),
                        turn.slot if self.pin_slots else None,
                    )
                )
                self._tell(Sent(turn.turn_id))
                try:
                    result = await turn.attempt
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    taken_back = self.scheduler.taken_back(turn.turn_id)
                    if not taken_back or (current is not None and current.cancelling()):
                        raise  # abandoned (its attempt is cancelled with it)
            finally:
                turn.attempt = None
                completed = result is not None and result.status is TurnStatus.COMPLETED
                self._tell(Ended(turn.turn_id, result.latency_ms / 1000 if completed else None))
            if result is None:  # its slot was taken back: queued again, what it wrote dropped
                turn.pending.clear()
                self.counts["preempted"] += 1
                continue
            self.metrics.ended(result)
            self._finish(turn, result.model_copy(update={"queue_ms": queue_ms}))
            return

    def _text(self, turn: _Turn, text: str) -> None:
        turn.pending.append(text)
        # A background turn streams nothing until it ends or its run holds the engine: its slot
        # may be taken back, and what it wrote is then dropped.
        if (
            not self.scheduler.background(turn.turn_id)
            and time.time() - turn.flushed_at >= self.chunk_interval_s
        ):
            self._flush(turn)

    def _flush(self, turn: _Turn) -> None:
        if turn.pending:
            turn.chunks.append(("".join(turn.pending), len(turn.pending)))
            turn.pending.clear()
            turn.flushed_at = time.time()
            self._notify()

    def _finish(self, turn: _Turn, result: TurnResult) -> None:
        self._flush(turn)
        turn.result = result
        turn.finished_at = time.time()
        self._tell(Closed(turn.turn_id))
        self._record_state()
        self._notify()

    async def _reap(self) -> None:
        """Abandons turns nobody polls any more (their run died); forgets finished turns; calls
        `on_idle` once the queue has held nothing and been asked nothing for `idle_exit_s`."""
        while True:
            await asyncio.sleep(min(self.lease_s, self.finished_keep_s, self.idle_exit_s) / 4)
            now = time.time()
            stale = [
                t.turn_id
                for t in self._turns.values()
                if t.result is None and now - t.last_poll > self.lease_s
            ]
            await self.abandon(stale)
            self._tell(Tick())
            for turn_id, turn in list(self._turns.items()):
                if turn.finished_at is not None and now - turn.finished_at > self.finished_keep_s:
                    del self._turns[turn_id]
            idle = self.scheduler.idle() and now - self._asked_at >= self.idle_exit_s
            if idle and self.on_idle is not None:
                self.on_idle()
                return


def queue_name(engine: AnyEngineSettings, capacity: int | None, code_version: str) -> str:
    """One queue per engine (and code version) on the cluster: every run derives the same name from
    where the engine is, so runs with other timeouts still share its slots."""
    identity = f"{kind_of(engine).queue_identity(engine)}:{capacity}:{code_version}"
    return f"engine-queue-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
