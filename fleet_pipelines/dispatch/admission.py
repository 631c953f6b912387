"""Admission per engine: one named Ray actor per engine owns its slots for the whole cluster.

The engine is the scarce resource. Every turn of every run connected to the cluster goes through
the `EngineQueue` actor of its engine, which sends a turn only when the engine has a free slot
(capacity: `EngineSettings.slots`, llama.cpp's own `/props`, or vLLM's `max_num_seqs`). The others
wait in one queue ordered by deadline, earliest first. Waiting is never a failure: the engine
clocks (first token, idle) start when a turn is sent. A turn whose deadline passes while it waits,
or that would not finish before it at the pace this engine has shown for its kind of turn, is
reported TIMEOUT with that reason and never sent.

The actor also runs the turns (it is the turn-worker pool turned into that queue: asyncio, one
process, I/O-bound) and keeps each turn's text as chunks, cut every `chunk_interval_s`, which the
run long-polls (`poll`). Ray Client (`ray://`) cannot carry streaming generators, so a poll is how
tokens reach a run through the production path as well; the run publishes them, workers stay
free of NATS. A turn the run stops polling for `lease_s` (the run died) or abandons is cancelled,
which closes its stream so the engine stops generating for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any

from ..domain.models import TurnKind, TurnRequest, TurnResult, TurnStatus
from ..llm.engine import ChatEngine, Engine, EngineError, EngineSettings, llama_cpp_slots, normalize_base_url
from ..llm.vllm_actor import VLLMActorEngine, VLLMActorSettings

AnyEngineSettings = EngineSettings | VLLMActorSettings
DEFAULT_SLOTS = 4  # an OpenAI-compatible engine that does not say how many requests it serves at once
AFFINITY_WINDOW_S = 1.0  # deadlines this close count as one when a turn may go to its slot first
NOT_STARTED = "NotStarted"  # error_type of a turn reported TIMEOUT without being sent


def engine_capacity(engine: AnyEngineSettings) -> int:
    if isinstance(engine, VLLMActorSettings):
        return engine.max_num_seqs
    return engine.slots or llama_cpp_slots(engine.base_url) or DEFAULT_SLOTS


def make_engine(engine: AnyEngineSettings) -> Engine:
    return VLLMActorEngine(engine) if isinstance(engine, VLLMActorSettings) else ChatEngine(engine)


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
            completion = await engine.stream(
                request.messages,
                request.temperature,
                request.max_tokens,
                request.stop,
                request.response_schema,
                collect,
                tools=request.tools or None,
                slot=slot,
            )
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


@dataclass
class _Turn:
    turn_id: str
    request: TurnRequest
    deadline: float
    submitted: float
    chunks: list[tuple[str, int]] = field(default_factory=list)  # (text, pieces) per chunk
    pending: list[str] = field(default_factory=list)
    flushed_at: float = 0.0
    last_poll: float = 0.0
    finished_at: float | None = None
    result: TurnResult | None = None
    task: asyncio.Task | None = None
    slot: int | None = None  # the engine slot granted to it


class EngineQueue:
    """The admission queue and turn runner of one engine (a named, detached, async Ray actor)."""

    def __init__(
        self,
        engine: AnyEngineSettings,
        capacity: int | None = None,
        chunk_interval_s: float = 0.3,
        lease_s: float = 60.0,
        finished_keep_s: float = 300.0,
    ):
        self.engine_settings = engine
        self.capacity = capacity or engine_capacity(engine)
        self.chunk_interval_s = chunk_interval_s
        self.lease_s = lease_s
        self.finished_keep_s = finished_keep_s
        self._engine = None
        self._turns: dict[str, _Turn] = {}
        self._waiting: list[tuple[float, int, str]] = []  # (deadline, arrival, turn id): EDF heap
        self._grants: dict[str, asyncio.Future] = {}
        self._running = 0
        # Slots by id, each with the conversation it last decoded (llama.cpp keeps that prompt in
        # the slot's cache): a turn goes to the free slot holding its conversation, else to the
        # free slot used longest ago. Ids are sent only to llama.cpp (`id_slot`), whose slots they
        # are; vLLM shares cached prefixes across all requests by itself.
        self._free_slots = list(range(self.capacity))
        self._slot_holds: dict[int, tuple[str, str]] = {}
        self._slot_used: dict[int, int] = {}
        self.pin_slots = (
            isinstance(engine, EngineSettings) and (llama_cpp_slots(engine.base_url) or 0) >= self.capacity
        )
        self._arrivals = 0
        self._changed: asyncio.Event | None = None
        self._reaper: asyncio.Task | None = None
        self._service_s: dict[TurnKind, float] = {}  # moving average of service time per turn kind
        self.counts = {"sent": 0, "not_started": 0, "abandoned": 0, "peak_running": 0, "peak_waiting": 0}

    # -- the run's side --------------------------------------------------------------------------

    async def submit(self, turns: list[tuple[str, TurnRequest, float]]) -> None:
        """Queues (turn id, request, deadline as time.time(), inf for none); returns at once."""
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap())
        now = time.time()
        for turn_id, request, deadline in turns:
            if turn_id in self._turns:
                continue  # a resubmission the actor already holds
            turn = _Turn(turn_id, request, deadline, submitted=now, flushed_at=now, last_poll=now)
            self._turns[turn_id] = turn
            turn.task = asyncio.create_task(self._run(turn))

    async def poll(self, cursors: dict[str, int], wait_s: float) -> dict[str, dict[str, Any]]:
        """New chunks (after each cursor) and results of these turns; waits up to `wait_s` for any.
        A turn this actor does not know (it was restarted) comes back with known=False."""
        deadline = time.monotonic() + wait_s
        while True:
            changed = self._event()
            now = time.time()
            out = {}
            for turn_id, cursor in cursors.items():
                turn = self._turns.get(turn_id)
                if turn is None:
                    out[turn_id] = {"known": False, "chunks": [], "result": None}
                    continue
                turn.last_poll = now
                if turn.chunks[cursor:] or turn.result is not None:
                    out[turn_id] = {"known": True, "chunks": turn.chunks[cursor:], "result": turn.result}
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
            if turn is not None and turn.task is not None and not turn.task.done():
                turn.task.cancel()
                cancelled += 1
        self.counts["abandoned"] += cancelled
        return cancelled

    def stats(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "running": self._running,
            "waiting": len(self._grants),
            "service_s": {k.value: round(v, 2) for k, v in self._service_s.items()},
            **self.counts,
        }

    # -- inside the actor ------------------------------------------------------------------------

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify(self) -> None:
        self._event().set()
        self._changed = asyncio.Event()

    def _expected_service_s(self, kind: TurnKind) -> float:
        return self._service_s.get(kind, 0.0)

    def _dispatch(self) -> None:
        """Grants free slots to waiting turns, earliest deadline first; one that cannot finish in
        time at this engine's pace is answered with the reason instead."""
        while self._running < self.capacity and self._waiting:
            deadline, _, turn_id = self._next_waiting()
            grant = self._grants.pop(turn_id, None)
            if grant is None or grant.done():
                continue
            turn = self._turns.get(turn_id)
            expected = self._expected_service_s(turn.request.kind) if turn else 0.0
            left = deadline - time.time()
            if left <= 0:
                grant.set_result("not sent: no free engine slot before the deadline")
                continue
            if left < expected:
                grant.set_result(
                    f"not sent: {left:.0f} s left before the deadline, a {turn.request.kind.value} turn "
                    f"takes ~{expected:.0f} s on this engine"
                )
                continue
            self._running += 1
            self.counts["peak_running"] = max(self.counts["peak_running"], self._running)
            if turn is not None:
                turn.slot = self._take_slot(turn.request.conversation)
            grant.set_result(None)

    def _next_waiting(self) -> tuple[float, int, str]:
        """The waiting turn to grant next: of those with the earliest deadline (within
        `AFFINITY_WINDOW_S`: the turns of one phase of a run share theirs), the first whose
        conversation a free slot holds, else the first."""
        earliest = self._waiting[0][0]
        held = {self._slot_holds.get(s) for s in self._free_slots}
        for entry in sorted(e for e in self._waiting if e[0] <= earliest + AFFINITY_WINDOW_S):
            turn = self._turns.get(entry[2])
            if turn is not None and turn.request.conversation in held:
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)
                return entry
        return heapq.heappop(self._waiting)

    def _take_slot(self, conversation: tuple[str, str]) -> int:
        held = [s for s in self._free_slots if self._slot_holds.get(s) == conversation]
        slot = held[0] if held else min(self._free_slots, key=lambda s: self._slot_used.get(s, -1))
        self._free_slots.remove(slot)
        self._slot_holds[slot] = conversation
        self._slot_used[slot] = self._arrivals
        return slot

    async def _admit(self, turn: _Turn) -> str | None:
        """None once the turn holds a slot; otherwise why it will not be sent."""
        grant = asyncio.get_running_loop().create_future()
        self._grants[turn.turn_id] = grant
        self._arrivals += 1
        heapq.heappush(self._waiting, (turn.deadline, self._arrivals, turn.turn_id))
        self.counts["peak_waiting"] = max(self.counts["peak_waiting"], len(self._grants))
        self._dispatch()
        left = turn.deadline - time.time()
        try:
            await asyncio.wait_for(asyncio.shield(grant), None if math.isinf(left) else max(left, 0))
        except (TimeoutError, asyncio.CancelledError) as exc:
            self._grants.pop(turn.turn_id, None)
            if grant.done() and grant.result() is None:
                self._release(turn)  # granted in the same instant: hand the slot on
            if isinstance(exc, asyncio.CancelledError):
                raise
            waited = time.time() - turn.submitted
            return f"not sent: no free engine slot before the deadline (waited {waited:.0f} s)"
        return grant.result()

    def _release(self, turn: _Turn) -> None:
        self._running -= 1
        if turn.slot is not None:
            self._free_slots.append(turn.slot)
        self._dispatch()

    async def _run(self, turn: _Turn) -> None:
        request = turn.request
        refused = await self._admit(turn)
        queue_ms = (time.time() - turn.submitted) * 1000
        if refused is not None:
            self.counts["not_started"] += 1
            result = TurnResult.unfinished(request, TurnStatus.TIMEOUT, refused, NOT_STARTED)
            self._finish(turn, result.model_copy(update={"queue_ms": queue_ms}))
            return
        self.counts["sent"] += 1
        try:
            if self._engine is None:
                self._engine = make_engine(self.engine_settings)
            result = await execute_turn(
                self._engine,
                request,
                turn.deadline,
                lambda text: self._text(turn, text),
                turn.slot if self.pin_slots else None,
            )
        finally:
            self._release(turn)
        if result.status is TurnStatus.COMPLETED:
            seconds = result.latency_ms / 1000
            held = self._service_s.get(request.kind)
            self._service_s[request.kind] = seconds if held is None else 0.7 * held + 0.3 * seconds
        self._finish(turn, result.model_copy(update={"queue_ms": queue_ms}))

    def _text(self, turn: _Turn, text: str) -> None:
        turn.pending.append(text)
        if time.time() - turn.flushed_at >= self.chunk_interval_s:
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
        self._notify()

    async def _reap(self) -> None:
        """Abandons turns nobody polls any more (their run died); forgets finished turns."""
        while True:
            await asyncio.sleep(min(self.lease_s, self.finished_keep_s) / 4)
            now = time.time()
            stale = [
                t.turn_id
                for t in self._turns.values()
                if t.result is None and now - t.last_poll > self.lease_s
            ]
            await self.abandon(stale)
            for turn_id, turn in list(self._turns.items()):
                if turn.finished_at is not None and now - turn.finished_at > self.finished_keep_s:
                    del self._turns[turn_id]


def queue_name(engine: AnyEngineSettings, capacity: int | None, code_version: str) -> str:
    """One queue per engine (and code version) on the cluster: every run derives the same name from
    where the engine is, so runs with other timeouts still share its slots."""
    where = (
        engine.actor_name() if isinstance(engine, VLLMActorSettings) else normalize_base_url(engine.base_url)
    )
    identity = (
        f"{where}:{engine.model if isinstance(engine, EngineSettings) else ''}:{capacity}:{code_version}"
    )
    return f"engine-queue-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
