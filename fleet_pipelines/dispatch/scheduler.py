"""The admission policy of one engine: which waiting turn gets a free slot, and when.

Synchronous and clock-injected: it imports no Ray, asyncio or clock of its own, holds no futures
and runs nothing. The admission actor (`admission.EngineQueue`) tells it what happens, one `Event`
at a time (`Scheduler.handle`: turns submitted, a turn waiting, withdrawn, sent, ended, closed; a
run polled or released; a tick of the clock), and carries out the `Decision`s it answers with
(`Grant`, `Refusal`, `TakeBack`). Unit tests drive it with a clock they move by hand.

The policy:

- **Slots.** The engine serves `capacity` turns at once. A turn waits until it is granted a slot;
  waiting is never a failure. The waiting turns are served earliest deadline first.
- **Refusal.** A turn whose deadline has passed while it waited, or that would not finish before
  it at the pace this engine has shown for its kind of turn (a moving average of service times),
  is refused with that reason and never sent.
- **Slot affinity.** Slots remember the conversation they last decoded (llama.cpp keeps that
  prompt in the slot's cache). Of the waiting turns whose deadlines are within
  `AFFINITY_WINDOW_S` of the earliest (one phase of a run), the first whose conversation a free
  slot holds goes first, to that slot; otherwise a turn takes the free slot used longest ago.
- **Claims.** A turn may come with its run's `Claim` (run id, council size). Runs whose councils
  fit in the slots together hold the engine (at least one, first come first served: promotion);
  the others wait in reserve. A turn without a claim is served like a holder's.
- **Reserve.** A reserve run's turns are background: they take only slots no other turn waits for,
  carry no deadline, and are taken back (`TakeBack`, the latest sent first) as soon as a holder's
  turn would otherwise wait. With pinned slots (llama.cpp) they also leave alone the slots that
  hold a holding run's conversations (its next phase reads them from the cache).
- **Deadline shift.** A reserve run's deadlines move by the time it spent in reserve: its clock
  runs only while it holds the engine.
- **Release and expiry.** A run releases the engine when its last turns are back (`Released`); a
  holding run past its (shifted) deadline plus `lease_s`, or a reserve run with no open turn and
  no sign of life for `lease_s`, gives its claim up at the next `Tick`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..domain.deliberation import Claim
from ..domain.models import TurnKind

AFFINITY_WINDOW_S = 1.0  # deadlines this close count as one when a turn may go to its slot first
Conversation = tuple[str, str]  # (task id, agent id): the prompt prefix a slot may hold


@dataclass(frozen=True)
class TurnSpec:
    """What the policy needs to know of a turn."""

    turn_id: str
    kind: TurnKind
    conversation: Conversation
    deadline: float  # as its run gave it (time of the injected clock; inf for none)
    run_id: str | None = None  # the run whose claim it came with (None: served like a holder's)


@dataclass(frozen=True)
class Grant:
    """The turn may be sent now, in `slot` (`reused`: the slot holds its conversation)."""

    turn_id: str
    slot: int
    reused: bool


@dataclass(frozen=True)
class Refusal:
    """The turn will not be sent: `reason` says why."""

    turn_id: str
    reason: str


@dataclass(frozen=True)
class TakeBack:
    """Stop this background turn's engine call: a holder's turn needs its slot (it waits again)."""

    turn_id: str


Decision = Grant | Refusal | TakeBack


@dataclass(frozen=True)
class Submitted:
    """Turns a run handed the queue, with its claim (None: served like a holder's). `deadline`:
    the latest of the batch's, a resubmission the queue already holds included (not in `turns`)."""

    turns: tuple[TurnSpec, ...]
    claim: Claim | None = None
    deadline: float = 0.0


@dataclass(frozen=True)
class Waiting:
    """The turn asks for a slot (again, after being taken back)."""

    turn_id: str


@dataclass(frozen=True)
class Withdrawn:
    """The turn gives up waiting (its deadline, or it was cancelled); a slot granted to it in the
    same instant goes to the next."""

    turn_id: str


@dataclass(frozen=True)
class Sent:
    """The granted turn's engine call started: from now on it may be taken back."""

    turn_id: str


@dataclass(frozen=True)
class Ended:
    """The turn's engine call is over; `service_s`: how long it took, if it completed (the pace its
    kind of turn is expected to keep)."""

    turn_id: str
    service_s: float | None = None


@dataclass(frozen=True)
class Closed:
    """The turn has its result, or was abandoned: its run no longer waits for it."""

    turn_id: str


@dataclass(frozen=True)
class Polled:
    """The run asked for news: it is alive."""

    run_id: str | None


@dataclass(frozen=True)
class Released:
    """The run sends no more turns: the engine goes to the reserve."""

    run_id: str


@dataclass(frozen=True)
class Tick:
    """Time passed: runs past their deadline, or in reserve and silent (they died), give up their
    claims."""


Event = Submitted | Waiting | Withdrawn | Sent | Ended | Closed | Polled | Released | Tick
NOTES = (Submitted, Sent, Closed, Polled)
"""The events that free no slot and queue no turn: always answered with no decision."""


@dataclass
class _Run:
    claim: Claim
    registered: float
    holds_since: float | None = None  # None: in reserve
    deadline: float = 0.0  # the latest deadline its turns were given (unshifted)
    active: float = 0.0  # when it last submitted or was polled for
    tasks: set[str] = field(default_factory=set)  # the task ids of its conversations

    @property
    def shift(self) -> float:
        """Seconds its deadlines move: the time it waited in reserve (inf while it still does)."""
        return math.inf if self.holds_since is None else self.holds_since - self.registered


@dataclass
class _Turn:
    spec: TurnSpec
    open: bool = True  # its run still waits for it (not finished, not abandoned)
    waiting: bool = False
    arrival: int = 0  # order among the waiting (each wait a new arrival)
    slot: int | None = None  # the slot it holds, from its grant until it ends or gives up
    sent_at: float | None = None  # its engine call started: it may be taken back from then on
    taken_back: bool = False


class Scheduler:
    """The admission policy of one engine (see the module's docstring)."""

    def __init__(
        self, capacity: int, clock: Callable[[], float], pin_slots: bool = False, lease_s: float = 60.0
    ):
        self.capacity = capacity
        self.clock = clock
        self.pin_slots = pin_slots  # slots are the engine's own (llama.cpp): keep holders' slots
        self.lease_s = lease_s
        self._turns: dict[str, _Turn] = {}
        self._runs: dict[str, _Run] = {}  # holding runs and the reserve, in arrival order
        self._arrivals = 0
        self._free_slots = list(range(capacity))
        self._slot_holds: dict[int, Conversation] = {}  # the conversation each slot last decoded
        self._slot_used: dict[int, int] = {}  # the arrival count when each slot was last granted
        self._service_s: dict[TurnKind, float] = {}  # moving average of service time per kind
        self.counts = {"peak_running": 0, "peak_waiting": 0, "slot_reused": 0}

    # -- what the actor tells it -----------------------------------------------------------------

    def handle(self, event: Event) -> list[Decision]:
        """What the scheduler decides on `event` (see each event's docstring)."""
        match event:
            case Submitted(turns, claim, deadline):
                if claim is not None:
                    self._claim(claim, deadline)
                for spec in turns:
                    self._add(spec)
                return []
            case Waiting(turn_id):
                return self._wait(turn_id)
            case Withdrawn(turn_id):
                return self._withdraw(turn_id)
            case Sent(turn_id):
                if (turn := self._turns.get(turn_id)) is not None:
                    turn.sent_at = self.clock()
                return []
            case Ended(turn_id, service_s):
                return self._ended(turn_id, service_s)
            case Closed(turn_id):
                self._close(turn_id)
                return []
            case Polled(run_id):
                if run_id is not None and (run := self._runs.get(run_id)) is not None:
                    run.active = self.clock()
                return []
            case Released(run_id):
                return self._release(run_id)
            case Tick():
                return self._expire()

    # -- the events' handlers ---------------------------------------------------------------------

    def _claim(self, claim: Claim, deadline: float) -> None:
        """A run's turns come with its claim: registered on its first batch (holding the engine if
        its council fits beside the holders'), its latest `deadline` kept."""
        now = self.clock()
        run = self._runs.get(claim.run_id)
        if run is None:
            run = self._runs[claim.run_id] = _Run(Claim(claim.run_id, max(1, claim.size)), registered=now)
            self._promote()
        run.deadline = max(run.deadline, deadline)
        run.active = now

    def _add(self, spec: TurnSpec) -> None:
        """A turn submitted (its run's claim, if any, already made)."""
        if spec.run_id is not None and (run := self._runs.get(spec.run_id)) is not None:
            run.tasks.add(spec.conversation[0])
        self._turns[spec.turn_id] = _Turn(spec)

    def _wait(self, turn_id: str) -> list[Decision]:
        turn = self._turns[turn_id]
        self._arrivals += 1
        turn.waiting, turn.arrival, turn.taken_back = True, self._arrivals, False
        waiting = sum(t.waiting for t in self._turns.values())
        self.counts["peak_waiting"] = max(self.counts["peak_waiting"], waiting)
        return self._dispatch()

    def _withdraw(self, turn_id: str) -> list[Decision]:
        turn = self._turns.get(turn_id)
        if turn is None:
            return []
        turn.waiting = False
        return self._free(turn)

    def _ended(self, turn_id: str, service_s: float | None = None) -> list[Decision]:
        turn = self._turns.get(turn_id)
        if turn is None:
            return []
        if service_s is not None:
            kind = turn.spec.kind
            held = self._service_s.get(kind)
            self._service_s[kind] = service_s if held is None else 0.7 * held + 0.3 * service_s
        return self._free(turn)

    def _close(self, turn_id: str) -> None:
        turn = self._turns.get(turn_id)
        if turn is None:
            return
        turn.open, turn.waiting = False, False
        if turn.slot is None:
            del self._turns[turn_id]

    def _release(self, run_id: str) -> list[Decision]:
        if self._runs.pop(run_id, None) is None:
            return []
        self._promote()
        return self._dispatch()

    def _expire(self) -> list[Decision]:
        """Gives up the claims of runs past their deadline, or in reserve and silent (they died)."""
        now = self.clock()
        for run in list(self._runs.values()):
            if run.holds_since is not None:
                over = now > run.deadline + run.shift + self.lease_s
            else:
                mine = any(t.open and t.spec.run_id == run.claim.run_id for t in self._turns.values())
                over = not mine and now - run.active > self.lease_s
            if over:
                del self._runs[run.claim.run_id]
        self._promote()
        return self._dispatch()

    # -- what the actor asks ---------------------------------------------------------------------

    def background(self, turn_id: str) -> bool:
        """A turn of a run in reserve: no deadline, streams nothing it may lose, may be taken back."""
        turn = self._turns.get(turn_id)
        return turn is not None and self._in_reserve(turn.spec.run_id)

    def taken_back(self, turn_id: str) -> bool:
        turn = self._turns.get(turn_id)
        return turn is not None and turn.taken_back

    def deadline(self, turn_id: str) -> float:
        """The turn's deadline: none while its run is in reserve, then moved by the time it waited."""
        spec = self._turns[turn_id].spec
        return self.deadline_of(spec.run_id, spec.deadline)

    def deadline_of(self, run_id: str | None, deadline: float) -> float:
        """A deadline of this run as the queue keeps it: moved by the run's time in reserve."""
        run = self._runs.get(run_id) if run_id is not None else None
        return deadline if run is None else deadline + run.shift

    def idle(self) -> bool:
        """No turn waits or runs, and no run holds the engine or waits in reserve."""
        return not self._turns and not self._runs

    def occupancy(self) -> tuple[int, int]:
        """(slots in use, turns waiting for one)."""
        return self.capacity - len(self._free_slots), sum(t.waiting for t in self._turns.values())

    def stats(self) -> dict:
        running, waiting = self.occupancy()
        return {
            "capacity": self.capacity,
            "running": running,
            "waiting": waiting,
            "holding": [r.claim.run_id for r in self._runs.values() if r.holds_since is not None],
            "reserve": [r.claim.run_id for r in self._runs.values() if r.holds_since is None],
            "service_s": {k.value: round(v, 2) for k, v in self._service_s.items()},
            **self.counts,
        }

    # -- the policy ------------------------------------------------------------------------------

    def _in_reserve(self, run_id: str | None) -> bool:
        run = self._runs.get(run_id) if run_id is not None else None
        return run is not None and run.holds_since is None

    def _promote(self) -> None:
        """Runs in reserve hold the engine, first come first, while their councils fit in the
        slots beside the holders' (the first one always)."""
        held = sum(r.claim.size for r in self._runs.values() if r.holds_since is not None)
        now = self.clock()
        for run in self._runs.values():
            if run.holds_since is not None:
                continue
            if held and held + run.claim.size > self.capacity:
                break
            run.holds_since = now
            held += run.claim.size

    def _free(self, turn: _Turn) -> list[Decision]:
        """Gives the turn's slot back, if it holds one, and grants what that allows."""
        turn.sent_at, turn.taken_back = None, False
        if turn.slot is None:
            if not turn.open and not turn.waiting:
                self._turns.pop(turn.spec.turn_id, None)
            return []
        self._free_slots.append(turn.slot)
        turn.slot = None
        if not turn.open:
            self._turns.pop(turn.spec.turn_id, None)
        return self._dispatch()

    def _dispatch(self) -> list[Decision]:
        """Grants free slots to waiting turns: holders' (and claimless) turns first, earliest
        deadline first, then the reserve's; one that cannot finish in time at this engine's pace
        is refused with the reason. A holder's turn that finds no free slot takes one back from a
        background turn."""
        decisions: list[Decision] = []
        while True:
            waiting = [t for t in self._turns.values() if t.waiting]
            if not waiting:
                return decisions
            foreground = [t for t in waiting if not self._in_reserve(t.spec.run_id)]
            if not self._free_slots:
                return decisions + self._take_back(len(foreground))
            slots = self._free_slots if foreground else self._background_slots()
            if not slots:
                return decisions  # the free slots hold conversations the holders go on with
            turn = self._next_waiting(foreground or waiting)
            turn.waiting = False
            if not self._in_reserve(turn.spec.run_id):
                expected = self._service_s.get(turn.spec.kind, 0.0)
                left = self.deadline(turn.spec.turn_id) - self.clock()
                if left <= 0:
                    decisions.append(
                        Refusal(turn.spec.turn_id, "not sent: no free engine slot before the deadline")
                    )
                    continue
                if left < expected:
                    decisions.append(
                        Refusal(
                            turn.spec.turn_id,
                            f"not sent: {left:.0f} s left before the deadline, a {turn.spec.kind.value} "
                            f"turn takes ~{expected:.0f} s on this engine",
                        )
                    )
                    continue
            decisions.append(self._grant(turn, slots))
            running = self.capacity - len(self._free_slots)
            self.counts["peak_running"] = max(self.counts["peak_running"], running)

    def _background_slots(self) -> list[int]:
        """The free slots a background turn may take: with pinned slots, those that hold no
        holding run's conversation (its next phase reads it from that slot's cache)."""
        if not self.pin_slots:
            return self._free_slots
        holders = {t for r in self._runs.values() if r.holds_since is not None for t in r.tasks}
        return [s for s in self._free_slots if self._slot_holds.get(s, ("", ""))[0] not in holders]

    def _take_back(self, foreground_waiting: int) -> list[Decision]:
        """Takes slots back from background turns, the latest sent first, for the holders' turns
        waiting (those already being taken back count)."""
        sent = [t for t in self._turns.values() if t.sent_at is not None]
        taking = sum(t.taken_back for t in sent)
        background = sorted(
            (t for t in sent if self._in_reserve(t.spec.run_id) and not t.taken_back),
            key=lambda t: t.sent_at or 0.0,
            reverse=True,
        )
        decisions: list[Decision] = []
        for turn in background[: max(0, foreground_waiting - taking)]:
            turn.taken_back = True
            decisions.append(TakeBack(turn.spec.turn_id))
        return decisions

    def _next_waiting(self, waiting: list[_Turn]) -> _Turn:
        """The waiting turn to grant next: of those with the earliest deadline (within
        `AFFINITY_WINDOW_S`: the turns of one phase of a run share theirs), the first whose
        conversation a free slot holds, else the first."""
        keyed = sorted(waiting, key=lambda t: (self.deadline(t.spec.turn_id), t.arrival))
        earliest = self.deadline(keyed[0].spec.turn_id)
        held = {self._slot_holds.get(s) for s in self._free_slots}
        for turn in keyed:
            if self.deadline(turn.spec.turn_id) > earliest + AFFINITY_WINDOW_S:
                break
            if turn.spec.conversation in held:
                return turn
        return keyed[0]

    def _grant(self, turn: _Turn, allowed: list[int]) -> Grant:
        """The allowed slot that holds its conversation, else the least recently used one."""
        conversation = turn.spec.conversation
        held = [s for s in allowed if self._slot_holds.get(s) == conversation]
        slot = held[0] if held else min(allowed, key=lambda s: self._slot_used.get(s, -1))
        self._free_slots.remove(slot)
        self._slot_holds[slot] = conversation
        self._slot_used[slot] = self._arrivals
        turn.slot = slot
        self.counts["slot_reused"] += bool(held)
        return Grant(turn.spec.turn_id, slot, bool(held))
