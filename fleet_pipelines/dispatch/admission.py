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

Runs hold the engine, one reserve waits on it (keeping the engine busy across runs). A turn may
come with its run's claim (run id, council size). Runs whose councils fit in the slots together
hold the engine (at least one); a run that does not fit waits in reserve, first come first
served, and its turns are background: they take only slots no other turn waits for, stream
nothing until they end, carry no deadline, and give their slot back (cancelled, queued again) as
soon as a turn of a holding run would otherwise wait. On llama.cpp they also leave alone the
slots that hold a holding run's conversations (its next phase reads them from the slot's cache).
A holding run never waits for a reserve run; the reserve run's deadline is moved by the time it
spent in reserve, so its clock runs only while it holds the engine. A run releases the engine
when its last turns (the judges) are back (`release`), or at its deadline at the latest. The run
queue lets one more run per engine start than hold it (dagster.yaml): that run's start, its first
steps and its proposals overlap the holder's checks, decision and end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
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
class _Run:
    """A run's claim on the engine: it holds the engine (`holds_since`) or waits in reserve."""

    run_id: str
    size: int  # its council: the slots its phases use at once
    registered: float
    holds_since: float | None = None
    deadline: float = 0.0  # the latest deadline its turns were given (unshifted)
    active: float = 0.0  # when it last submitted or polled
    tasks: set[str] = field(default_factory=set)  # its task ids (its conversations' first half)

    @property
    def shift(self) -> float:
        """Seconds its deadlines move: the time it waited in reserve (inf while it still does)."""
        return math.inf if self.holds_since is None else self.holds_since - self.registered


@dataclass
class _Turn:
    turn_id: str
    request: TurnRequest
    given_deadline: float  # as the run gave it; `EngineQueue._deadline` adds its run's shift
    submitted: float
    chunks: list[tuple[str, int]] = field(default_factory=list)  # (text, pieces) per chunk
    pending: list[str] = field(default_factory=list)
    flushed_at: float = 0.0
    last_poll: float = 0.0
    finished_at: float | None = None
    result: TurnResult | None = None
    task: asyncio.Task | None = None
    slot: int | None = None  # the engine slot granted to it
    slot_reused: bool = False  # that slot held its conversation (llama.cpp reads it from cache)
    run_id: str | None = None  # the run whose claim it came with (None: foreground always)
    attempt: asyncio.Task | None = None  # its engine call, while it has a slot
    preempting: bool = False  # its slot is being taken back (a background turn)
    sent_at: float = 0.0


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
        self._waiting: list[tuple[float, int, str]] = []  # (given deadline, arrival, turn id)
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
        self._runs: dict[str, _Run] = {}  # claims: holding runs and the reserve, in arrival order
        self.counts = {"sent": 0, "not_started": 0, "abandoned": 0, "peak_running": 0, "peak_waiting": 0}
        self.counts |= {"preempted": 0, "background_sent": 0, "slot_reused": 0}

    # -- the run's side --------------------------------------------------------------------------

    async def submit(
        self, turns: list[tuple[str, TurnRequest, float]], claim: tuple[str, int] | None = None
    ) -> None:
        """Queues (turn id, request, deadline as time.time(), inf for none); returns at once.
        `claim`: (run id, council size) of the run they belong to (see the module's docstring)."""
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap())
        now = time.time()
        run = self._claim(claim, max((d for _, _, d in turns), default=0.0), now) if claim else None
        for turn_id, request, deadline in turns:
            if turn_id in self._turns:
                continue  # a resubmission the actor already holds
            turn = _Turn(turn_id, request, deadline, submitted=now, flushed_at=now, last_poll=now)
            turn.run_id = run.run_id if run else None
            if run is not None:
                run.tasks.add(request.task_id)
            self._turns[turn_id] = turn
            turn.task = asyncio.create_task(self._run(turn))

    async def release(self, run_id: str) -> None:
        """The run sends no more turns: the engine goes to the reserve."""
        if self._runs.pop(run_id, None) is not None:
            self._promote()
            self._dispatch()

    async def deadline_of(self, run_id: str, deadline: float) -> float:
        """A deadline of this run as the queue keeps it: moved by the run's time in reserve."""
        run = self._runs.get(run_id)
        return deadline if run is None else deadline + run.shift

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
                if turn.run_id in self._runs:
                    self._runs[turn.run_id].active = now
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
            "holding": [r.run_id for r in self._runs.values() if r.holds_since is not None],
            "reserve": [r.run_id for r in self._runs.values() if r.holds_since is None],
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

    def _claim(self, claim: tuple[str, int], deadline: float, now: float) -> _Run:
        run_id, size = claim
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run(run_id, max(1, size), registered=now)
            self._promote()
        run.deadline = max(run.deadline, deadline)
        run.active = now
        return run

    def _promote(self) -> None:
        """Runs in reserve hold the engine, first come first, while their councils fit in the
        slots beside the holders' (the first one always)."""
        held = sum(r.size for r in self._runs.values() if r.holds_since is not None)
        now = time.time()
        for run in self._runs.values():
            if run.holds_since is not None:
                continue
            if held and held + run.size > self.capacity:
                break
            run.holds_since = now
            held += run.size

    def _expire_claims(self, now: float) -> None:
        """A holding run past its deadline, or a run in reserve whose turns nobody polled for
        `lease_s` (it died), gives its claim up."""
        for run in list(self._runs.values()):
            if run.holds_since is not None:
                over = now > run.deadline + run.shift + self.lease_s
            else:
                mine = [t for t in self._turns.values() if t.run_id == run.run_id and t.result is None]
                over = not mine and now - run.active > self.lease_s
            if over:
                del self._runs[run.run_id]
        self._promote()
        self._dispatch()

    def _background(self, turn: _Turn | None) -> bool:
        """A turn of a run in reserve."""
        run = self._runs.get(turn.run_id) if turn is not None and turn.run_id else None
        return run is not None and run.holds_since is None

    def _deadline(self, turn: _Turn) -> float:
        """Its deadline: none while its run is in reserve, then moved by the time it waited."""
        run = self._runs.get(turn.run_id) if turn.run_id else None
        return turn.given_deadline if run is None else turn.given_deadline + run.shift

    def _dispatch(self) -> None:
        """Grants free slots to waiting turns: holders' (and claimless) turns first, earliest
        deadline first, then the reserve's; one that cannot finish in time at this engine's pace
        is answered with the reason instead. A holder's turn that finds no free slot takes one
        back from a background turn."""
        while self._waiting:
            self._waiting = [e for e in self._waiting if e[2] in self._grants]  # drop given-up ones
            if not self._waiting:
                return
            foreground = [e for e in self._waiting if not self._background(self._turns.get(e[2]))]
            if self._running >= self.capacity:
                self._preempt(len(foreground))
                return
            slots = self._free_slots if foreground else self._background_slots()
            if not slots:
                return  # the free slots hold conversations the holders go on with
            entry = self._next_waiting(foreground or self._waiting)
            self._waiting.remove(entry)
            grant = self._grants.pop(entry[2], None)
            if grant is None or grant.done():
                continue
            turn = self._turns.get(entry[2])
            if turn is not None and not self._background(turn):
                expected = self._expected_service_s(turn.request.kind)
                left = self._deadline(turn) - time.time()
                if left <= 0:
                    grant.set_result("not sent: no free engine slot before the deadline")
                    continue
                if left < expected:
                    grant.set_result(
                        f"not sent: {left:.0f} s left before the deadline, a {turn.request.kind.value} "
                        f"turn takes ~{expected:.0f} s on this engine"
                    )
                    continue
            self._running += 1
            self.counts["peak_running"] = max(self.counts["peak_running"], self._running)
            if turn is not None:
                turn.slot, turn.slot_reused = self._take_slot(turn.request.conversation, slots)
                self.counts["slot_reused"] += turn.slot_reused
            grant.set_result(None)

    def _background_slots(self) -> list[int]:
        """The free slots a background turn may take: on llama.cpp, those that hold no holding
        run's conversation (its next phase reads it from that slot's cache)."""
        if not self.pin_slots:
            return self._free_slots
        holders = {t for r in self._runs.values() if r.holds_since is not None for t in r.tasks}
        return [s for s in self._free_slots if self._slot_holds.get(s, ("", ""))[0] not in holders]

    def _preempt(self, foreground_waiting: int) -> None:
        """Takes slots back from background turns, the latest started first, for the holders'
        turns waiting (those already being taken back count)."""
        running = [t for t in self._turns.values() if t.attempt is not None and not t.attempt.done()]
        taking = sum(t.preempting for t in running)
        background = sorted(
            (t for t in running if self._background(t) and not t.preempting),
            key=lambda t: t.sent_at,
            reverse=True,
        )
        for turn in background[: max(0, foreground_waiting - taking)]:
            turn.preempting = True
            turn.attempt.cancel()

    def _next_waiting(self, entries: list[tuple[float, int, str]]) -> tuple[float, int, str]:
        """The waiting turn to grant next: of those with the earliest deadline (within
        `AFFINITY_WINDOW_S`: the turns of one phase of a run share theirs), the first whose
        conversation a free slot holds, else the first."""
        keyed = sorted(
            ((self._deadline(t) if (t := self._turns.get(e[2])) else e[0], e[1]), e) for e in entries
        )
        earliest = keyed[0][0][0]
        held = {self._slot_holds.get(s) for s in self._free_slots}  # (background: see _dispatch)
        for (deadline, _), entry in keyed:
            if deadline > earliest + AFFINITY_WINDOW_S:
                break
            turn = self._turns.get(entry[2])
            if turn is not None and turn.request.conversation in held:
                return entry
        return keyed[0][1]

    def _take_slot(self, conversation: tuple[str, str], allowed: list[int]) -> tuple[int, bool]:
        """The allowed slot that holds this conversation, else the least recently used one; and
        whether it held it."""
        held = [s for s in allowed if self._slot_holds.get(s) == conversation]
        slot = held[0] if held else min(allowed, key=lambda s: self._slot_used.get(s, -1))
        self._free_slots.remove(slot)
        self._slot_holds[slot] = conversation
        self._slot_used[slot] = self._arrivals
        return slot, bool(held)

    async def _admit(self, turn: _Turn) -> str | None:
        """None once the turn holds a slot; otherwise why it will not be sent."""
        grant = asyncio.get_running_loop().create_future()
        self._grants[turn.turn_id] = grant
        self._arrivals += 1
        entry = (turn.given_deadline, self._arrivals, turn.turn_id)
        self._waiting.append(entry)
        self.counts["peak_waiting"] = max(self.counts["peak_waiting"], len(self._grants))
        self._dispatch()
        try:
            while not grant.done():  # looked at again: a reserve run's deadline starts later
                left = self._deadline(turn) - time.time()
                if left <= 0:
                    raise TimeoutError
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(grant), min(left, 5.0))
        except (TimeoutError, asyncio.CancelledError) as exc:
            self._grants.pop(turn.turn_id, None)
            with contextlib.suppress(ValueError):
                self._waiting.remove(entry)
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
        while True:
            refused = await self._admit(turn)
            queue_ms = (time.time() - turn.submitted) * 1000
            if refused is not None:
                self.counts["not_started"] += 1
                result = TurnResult.unfinished(request, TurnStatus.TIMEOUT, refused, NOT_STARTED)
                self._finish(turn, result.model_copy(update={"queue_ms": queue_ms}))
                return
            self.counts["sent"] += 1
            self.counts["background_sent"] += self._background(turn)
            result = None
            try:
                if self._engine is None:
                    self._engine = make_engine(self.engine_settings)
                turn.sent_at = time.time()
                turn.attempt = asyncio.create_task(
                    execute_turn(
                        self._engine,
                        request,
                        self._deadline(turn),  # none for a background turn: it has no deadline yet
                        lambda text: self._text(turn, text),
                        turn.slot if self.pin_slots else None,
                    )
                )
                try:
                    result = await turn.attempt
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if not turn.preempting or (current is not None and current.cancelling()):
                        raise  # abandoned (its attempt is cancelled with it)
            finally:
                turn.attempt = None
                self._release(turn)
            if result is None:  # its slot was taken back: queued again, what it wrote dropped
                turn.preempting = False
                turn.pending.clear()
                self.counts["preempted"] += 1
                continue
            if result.status is TurnStatus.COMPLETED:
                seconds = result.latency_ms / 1000
                held = self._service_s.get(request.kind)
                self._service_s[request.kind] = seconds if held is None else 0.7 * held + 0.3 * seconds
            self._finish(turn, result.model_copy(update={"queue_ms": queue_ms}))
            return

    def _text(self, turn: _Turn, text: str) -> None:
        turn.pending.append(text)
        # A background turn streams nothing until it ends or its run holds the engine: its slot
        # may be taken back, and what it wrote is then dropped.
        if not self._background(turn) and time.time() - turn.flushed_at >= self.chunk_interval_s:
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
            self._expire_claims(now)
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
