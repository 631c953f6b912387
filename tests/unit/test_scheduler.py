"""The admission policy (dispatch/scheduler.py) on its own: no Ray, no asyncio, a clock the test
moves by hand. Each test tells the scheduler what the actor would (events: turns submitted, a turn
waiting, sent, ended) and checks what it decides."""

from __future__ import annotations

import math

import pytest

from fleet_pipelines.dispatch.scheduler import (
    Closed,
    Ended,
    Grant,
    Polled,
    Refusal,
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
from fleet_pipelines.domain.deliberation import Claim
from fleet_pipelines.domain.models import TurnKind


class Clock:
    """The time the scheduler reads; the test moves it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spec(
    key: str, deadline: float = math.inf, run: str | None = None, kind: TurnKind = TurnKind.PROPOSE
) -> TurnSpec:
    """Turn `task-agent[-target]`: its conversation is (task, target or agent)."""
    task, agent, *target = key.split("-")
    return TurnSpec(key, kind, (task, target[0] if target else agent), deadline, run)


def submit(
    scheduler: Scheduler, keys: list[str], run: Claim | None = None, deadline: float = math.inf
) -> list:
    """Adds the turns with their run's claim and lets each wait; the decisions, in order."""
    turns = tuple(spec(key, deadline, run.run_id if run else None) for key in keys)
    decisions = scheduler.handle(Submitted(turns, run, deadline))
    for key in keys:
        decisions += scheduler.handle(Waiting(key))
    return decisions


def granted(decisions: list) -> list[str]:
    return [d.turn_id for d in decisions if isinstance(d, Grant)]


def send(scheduler: Scheduler, decisions: list) -> None:
    for turn_id in granted(decisions):
        scheduler.handle(Sent(turn_id))


def test_turns_wait_for_a_free_slot_and_are_served_earliest_deadline_first():
    clock = Clock()
    scheduler = Scheduler(2, clock)
    assert granted(submit(scheduler, ["t-1", "t-2"], deadline=clock.now + 600)) == ["t-1", "t-2"]
    assert submit(scheduler, ["t-late"], deadline=clock.now + 900) == []
    assert submit(scheduler, ["t-soon"], deadline=clock.now + 300) == []
    assert scheduler.stats()["waiting"] == 2 and scheduler.stats()["running"] == 2
    assert granted(scheduler.handle(Ended("t-1", 2.0))) == ["t-soon"]
    assert granted(scheduler.handle(Ended("t-2", 2.0))) == ["t-late"]
    assert scheduler.stats()["peak_waiting"] == 2 and scheduler.stats()["peak_running"] == 2


def test_a_turn_past_its_deadline_or_that_cannot_finish_in_time_is_refused_with_the_reason():
    clock = Clock()
    scheduler = Scheduler(1, clock)
    send(scheduler, submit(scheduler, ["t-1"], deadline=clock.now + 600))
    submit(scheduler, ["t-judge"], deadline=clock.now + 30)
    scheduler.handle(Submitted((spec("t-2", clock.now + 100, kind=TurnKind.PROPOSE),)))
    scheduler.handle(Waiting("t-2"))
    clock.now += 40  # t-judge's deadline passed while it waited
    decisions = scheduler.handle(Ended("t-1", service_s=80.0))  # proposals take ~80 s on this engine
    refusals = {d.turn_id: d.reason for d in decisions if isinstance(d, Refusal)}
    assert refusals["t-judge"] == "not sent: no free engine slot before the deadline"
    assert (
        refusals["t-2"]
        == "not sent: 60 s left before the deadline, a propose turn takes ~80 s on this engine"
    )
    assert granted(decisions) == [] and scheduler.stats()["running"] == 0


def test_a_turn_goes_to_the_free_slot_holding_its_conversation_else_the_one_used_longest_ago():
    clock = Clock()
    scheduler = Scheduler(2, clock, pin_slots=True)
    decisions = submit(scheduler, ["t-1", "t-2"], deadline=clock.now + 600)
    slots = {d.turn_id: d.slot for d in decisions}
    assert sorted(slots.values()) == [0, 1]
    scheduler.handle(Ended("t-1", 1.0))
    scheduler.handle(Ended("t-2", 1.0))
    decisions = submit(scheduler, ["t-1-2", "t-2-1"], deadline=clock.now + 600)  # critiques
    by_turn = {d.turn_id: d for d in decisions}
    assert by_turn["t-1-2"].slot == slots["t-2"] and by_turn["t-2-1"].slot == slots["t-1"]
    assert by_turn["t-1-2"].reused and by_turn["t-2-1"].reused
    assert scheduler.stats()["slot_reused"] == 2
    scheduler.handle(Ended("t-2-1", 1.0))
    scheduler.handle(Ended("t-1-2", 1.0))
    # A new conversation takes the slot granted longest ago (t-1-2's), whichever freed last.
    assert submit(scheduler, ["u-1"], deadline=clock.now + 600) == [Grant("u-1", slots["t-2"], False)]


def test_of_one_phase_the_turn_whose_conversation_a_free_slot_holds_goes_first():
    clock = Clock()
    scheduler = Scheduler(1, clock)
    send(scheduler, submit(scheduler, ["t-1"], deadline=clock.now + 600))
    submit(scheduler, ["t-2", "t-3-1"], deadline=clock.now + 600)  # t-3-1 reads t-1's conversation
    assert granted(scheduler.handle(Ended("t-1", 1.0))) == ["t-3-1"]


def test_affinity_does_not_reach_past_the_window_of_the_earliest_deadline():
    clock = Clock()
    scheduler = Scheduler(1, clock)
    send(scheduler, submit(scheduler, ["a-1"], deadline=clock.now + 600))
    submit(scheduler, ["b-1"], deadline=clock.now + 100)
    submit(scheduler, ["a-2-1"], deadline=clock.now + 700)  # a-1's conversation, a later deadline
    assert granted(scheduler.handle(Ended("a-1", 1.0))) == ["b-1"]


def test_runs_whose_councils_fit_hold_the_engine_the_next_waits_in_reserve_until_released():
    clock = Clock()
    scheduler = Scheduler(4, clock)
    submit(scheduler, ["a-1", "a-2"], Claim("run-a", 2), clock.now + 600)
    submit(scheduler, ["b-1", "b-2"], Claim("run-b", 2), clock.now + 600)
    submit(scheduler, ["c-1", "c-2"], Claim("run-c", 2), clock.now + 600)
    assert scheduler.stats()["holding"] == ["run-a", "run-b"] and scheduler.stats()["reserve"] == ["run-c"]
    assert scheduler.background("c-1") and not scheduler.background("a-1")
    scheduler.handle(Released("run-a"))
    assert scheduler.stats()["holding"] == ["run-b", "run-c"] and not scheduler.background("c-1")


def test_the_queue_is_idle_only_with_no_turn_and_no_claim():
    clock = Clock()
    scheduler = Scheduler(2, clock)
    assert scheduler.idle()
    decisions = submit(scheduler, ["a-1"], Claim("run-a", 1), clock.now + 600)
    send(scheduler, decisions)
    assert not scheduler.idle()
    scheduler.handle(Ended("a-1", 1.0))
    scheduler.handle(Closed("a-1"))
    assert not scheduler.idle()  # the run still holds the engine
    scheduler.handle(Released("run-a"))
    assert scheduler.idle()


def test_a_reserve_run_takes_only_idle_slots_and_gives_the_latest_sent_back_to_a_holder():
    clock = Clock()
    scheduler = Scheduler(2, clock)
    send(scheduler, submit(scheduler, ["a-1", "a-2"], Claim("run-a", 2), clock.now + 600))
    assert submit(scheduler, ["b-1", "b-2"], Claim("run-b", 2), clock.now + 600) == []
    decisions = scheduler.handle(Ended("a-1", 1.0))  # the holder scores: its idle slots go to b
    assert decisions == [Grant("b-1", 0, False)] and scheduler.background("b-1")
    send(scheduler, decisions)
    clock.now += 1
    send(scheduler, scheduler.handle(Ended("a-2", 1.0)))
    assert scheduler.stats()["running"] == 2
    # The holder's judge comes: the background turn sent last is taken back, once.
    assert submit(scheduler, ["a-judge"], Claim("run-a", 2), clock.now + 600) == [TakeBack("b-2")]
    assert scheduler.taken_back("b-2") and not scheduler.taken_back("b-1")
    scheduler.handle(Submitted((spec("a-x", clock.now + 600, "run-a"),)))
    assert scheduler.handle(Waiting("a-x")) == [TakeBack("b-1")]  # a second holder's turn: the other one
    assert scheduler.handle(Tick()) == []  # no more taken back than holders' turns wait
    assert scheduler.handle(Ended("b-2")) == [Grant("a-judge", 1, False)]
    assert scheduler.handle(Waiting("b-2")) == []  # it waits again; nothing is taken back for it
    assert granted(scheduler.handle(Ended("b-1"))) == ["a-x"]
    assert not scheduler.taken_back("b-1")


def test_with_pinned_slots_the_reserve_leaves_the_slots_holding_a_holders_conversations():
    clock = Clock()
    scheduler = Scheduler(3, clock, pin_slots=True)
    decisions = submit(scheduler, ["a-1", "a-2"], Claim("run-a", 2), clock.now + 600)
    assert sorted(d.slot for d in decisions) == [0, 1]
    decisions = submit(scheduler, ["b-1", "b-2"], Claim("run-b", 2), clock.now + 600)
    assert decisions == [Grant("b-1", 2, False)]  # the slot run-a never used
    assert (
        scheduler.handle(Ended("a-1", 1.0)) == [] and scheduler.handle(Ended("a-2", 1.0)) == []
    )  # kept for run-a
    assert granted(scheduler.handle(Released("run-a"))) == ["b-2"]


def test_a_reserve_runs_deadline_is_moved_by_the_time_it_waited():
    clock = Clock()
    scheduler = Scheduler(1, clock)
    send(scheduler, submit(scheduler, ["a-1"], Claim("run-a", 1), clock.now + 600))
    given = clock.now + 300
    submit(scheduler, ["b-1"], Claim("run-b", 1), given)
    assert math.isinf(scheduler.deadline_of("run-b", given)) and math.isinf(scheduler.deadline("b-1"))
    clock.now += 400  # past its given deadline, in reserve: not refused, sent as background
    assert scheduler.handle(Ended("a-1", 1.0)) == [Grant("b-1", 0, False)]
    scheduler.handle(Released("run-a"))
    assert scheduler.deadline("b-1") == given + 400 and not scheduler.background("b-1")
    assert scheduler.deadline_of(None, given) == given  # a turn without a claim keeps its own


def test_expired_claims_a_holder_past_its_deadline_and_a_silent_reserve_run():
    clock = Clock()
    scheduler = Scheduler(1, clock, lease_s=60)
    submit(scheduler, ["a-1"], Claim("run-a", 1), clock.now + 100)
    submit(scheduler, ["b-1"], Claim("run-b", 1), clock.now + 100)
    scheduler.handle(Closed("b-1"))  # abandoned: run-b has no open turn left
    clock.now += 61
    scheduler.handle(Tick())
    assert scheduler.stats()["reserve"] == [] and scheduler.stats()["holding"] == ["run-a"]
    scheduler.handle(Polled("run-a"))
    clock.now += 100
    scheduler.handle(Tick())  # run-a: past its deadline plus the lease
    assert scheduler.stats()["holding"] == []


def test_a_turn_that_gives_up_hands_a_slot_granted_in_the_same_instant_to_the_next():
    clock = Clock()
    scheduler = Scheduler(1, clock)
    assert granted(submit(scheduler, ["t-1"])) == ["t-1"]
    submit(scheduler, ["t-2"])
    assert granted(scheduler.handle(Withdrawn("t-1"))) == ["t-2"]
    scheduler.handle(Closed("t-1"))
    assert scheduler.handle(Withdrawn("t-1")) == []  # forgotten


@pytest.mark.parametrize("capacity", [1, 3])
def test_claims_of_a_council_larger_than_the_engine_still_hold_it_alone(capacity: int):
    scheduler = Scheduler(capacity, Clock())
    submit(scheduler, ["a-1"], Claim("run-a", 8))
    submit(scheduler, ["b-1"], Claim("run-b", 1))
    assert scheduler.stats()["holding"] == ["run-a"] and scheduler.stats()["reserve"] == ["run-b"]


def test_the_scheduler_imports_no_ray_asyncio_or_clock():
    import ast
    import inspect

    from fleet_pipelines.dispatch import scheduler

    tree = ast.parse(inspect.getsource(scheduler))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    roots = {name.split(".")[0] for name in imported}
    assert not roots & {"ray", "asyncio", "time", "datetime", "threading"}, roots
