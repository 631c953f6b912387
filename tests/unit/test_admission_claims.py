"""Runs that hold the engine and the one in reserve (dispatch/admission.py), on the admission
queue itself with an engine whose turns end when the test says so: a reserve run fills only the
slots nobody else waits for, gives them back at once to a holding run's turn, streams nothing it
may lose, and its deadline starts only when it holds the engine."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable

from fleet_pipelines.dispatch.admission import EngineQueue, Submission, TurnNews
from fleet_pipelines.domain.deliberation import Claim
from fleet_pipelines.domain.models import Message, Role, TurnKind, TurnRequest, TurnStatus
from fleet_pipelines.llm.engine import ChatCall, Completion, EngineSettings, OnText


class GatedEngine:
    """A turn streams one piece (naming its attempt), then waits until `finish(key)`."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.log: list[tuple[str, str]] = []  # ("start" | "cancelled" | "end", key)
        self.attempts: Counter[str] = Counter()

    def finish(self, *keys: str) -> None:
        for key in keys:
            self.gates.setdefault(key, asyncio.Event()).set()

    def running(self) -> set[str]:
        state: dict[str, str] = {}
        for event, key in self.log:
            state[key] = event
        return {key for key, event in state.items() if event == "start"}

    async def stream(self, call: ChatCall, on_text: OnText | None = None) -> Completion:
        assert on_text is not None  # the queue streams every turn
        key = call.messages[-1].content
        self.attempts[key] += 1
        attempt = self.attempts[key]
        self.log.append(("start", key))
        on_text(f"{key} attempt {attempt}. ")
        try:
            await self.gates.setdefault(key, asyncio.Event()).wait()
        except asyncio.CancelledError:
            self.log.append(("cancelled", key))
            raise
        self.log.append(("end", key))
        return Completion(f"{key} attempt {attempt}, done", "gated", 1, 1, 1.0, 1.0, 1)


def request(key: str, kind: TurnKind = TurnKind.PROPOSE) -> TurnRequest:
    task, agent = key.split("-")
    return TurnRequest(
        task_id=task,
        agent_id=agent,
        role=Role.DEV,
        kind=kind,
        round=0,
        messages=[Message(role="user", content=key)],
        temperature=0.2,
        max_tokens=16,
    )


def new_queue(capacity: int) -> tuple[EngineQueue, GatedEngine]:
    # Nothing listens on port 9: the queue asks /props once, finds no llama.cpp, pins no slots.
    queue = EngineQueue(EngineSettings(base_url="http://127.0.0.1:9/v1", model="gated"), capacity, 0.0)
    engine = queue._engine = GatedEngine()
    return queue, engine


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the queue never got there")


def text(queue: EngineQueue, turn_id: str) -> str:
    return "".join(chunk for chunk, _ in queue._turns[turn_id].chunks)


def test_a_reserve_run_fills_idle_slots_and_gives_them_back_to_the_holder_at_once():
    async def scenario() -> None:
        queue, engine = new_queue(capacity=2)
        deadline = time.time() + 600
        await queue.submit(
            [Submission(k, request(k), deadline) for k in ("a-1", "a-2")], claim=Claim("run-a", 2)
        )
        await until(lambda: engine.running() == {"a-1", "a-2"})
        # A second run, while the first holds every slot: in reserve, its turns wait.
        await queue.submit(
            [Submission(k, request(k), deadline) for k in ("b-1", "b-2")], claim=Claim("run-b", 2)
        )
        assert queue.stats()["holding"] == ["run-a"] and queue.stats()["reserve"] == ["run-b"]
        await asyncio.sleep(0.05)
        assert engine.running() == {"a-1", "a-2"}
        # The holder scores (no turn of its own in the engine): the reserve's turns take the slots.
        engine.finish("a-1", "a-2")
        await until(lambda: engine.running() == {"b-1", "b-2"})
        # ... and stream nothing while their slot may still be taken back.
        assert text(queue, "b-1") == text(queue, "b-2") == ""
        # The holder's judge comes: it does not wait for them, the latest sent gives its slot back.
        await queue.submit(
            [Submission("a-judge", request("a-judge", TurnKind.JUDGE), deadline)], claim=Claim("run-a", 2)
        )
        await until(lambda: "a-judge" in engine.running())
        assert ("cancelled", "b-2") in engine.log and engine.running() == {"b-1", "a-judge"}
        assert queue.counts["preempted"] == 1
        # The holder is done with the engine: the reserve run holds it, its turn goes on.
        engine.finish("a-judge")
        await until(lambda: queue._turns["a-judge"].result is not None)
        await queue.release("run-a")
        assert queue.stats()["holding"] == ["run-b"] and queue.stats()["reserve"] == []
        await until(lambda: engine.running() == {"b-1", "b-2"})
        engine.finish("b-1", "b-2")
        await until(lambda: all(queue._turns[k].result is not None for k in ("b-1", "b-2")))
        assert [queue._turns[k].result.status for k in ("b-1", "b-2")] == [TurnStatus.COMPLETED] * 2
        # What the taken-back attempt wrote was dropped: the run sees its second attempt only.
        assert engine.attempts["b-2"] == 2 and queue._turns["b-2"].result.content == "b-2 attempt 2, done"
        assert "attempt 1" not in text(queue, "b-2") and "attempt 2" in text(queue, "b-2")
        assert queue._turns["a-judge"].result.status is TurnStatus.COMPLETED

    asyncio.run(scenario())


def test_on_llama_cpp_a_reserve_run_leaves_the_slots_holding_the_holders_conversations():
    async def scenario() -> None:
        queue, engine = new_queue(capacity=3)
        queue.scheduler.pin_slots = True  # as on llama.cpp: turns go to the slot holding their conversation
        deadline = time.time() + 600
        await queue.submit(
            [Submission(k, request(k), deadline) for k in ("a-1", "a-2")], claim=Claim("run-a", 2)
        )
        await until(lambda: engine.running() == {"a-1", "a-2"})
        await queue.submit(
            [Submission(k, request(k), deadline) for k in ("b-1", "b-2")], claim=Claim("run-b", 2)
        )
        await until(lambda: engine.running() == {"a-1", "a-2", "b-1"})  # the slot A never used
        engine.finish("a-1", "a-2")  # between A's phases: its slots keep its proposals
        await asyncio.sleep(0.05)
        assert engine.running() == {"b-1"}
        assert {queue._turns[k].slot for k in ("a-1", "a-2")} == {0, 1} and queue._turns["b-1"].slot == 2
        # A's critique of a-1 goes to the slot that wrote a-1, then A is done with the engine.
        critique = request("a-2", TurnKind.CRITIQUE).model_copy(update={"target_agent_id": "1"})
        await queue.submit([Submission("a-2-on-1", critique, deadline)], claim=Claim("run-a", 2))
        await until(lambda: queue._turns["a-2-on-1"].slot is not None)
        assert queue._turns["a-2-on-1"].slot == queue._turns["a-1"].slot
        engine.finish("a-2")  # the critique's key (its last message) is "a-2"
        await until(lambda: queue._turns["a-2-on-1"].result is not None)
        await queue.release("run-a")
        await until(lambda: engine.running() == {"b-1", "b-2"})
        engine.finish("b-1", "b-2")
        await until(lambda: all(queue._turns[k].result is not None for k in ("b-1", "b-2")))

    asyncio.run(scenario())


def test_a_reserve_runs_deadline_starts_when_it_holds_the_engine():
    async def scenario() -> None:
        queue, engine = new_queue(capacity=1)
        far = time.time() + 600
        await queue.submit([Submission("a-1", request("a-1"), far)], claim=Claim("run-a", 1))
        await until(lambda: engine.running() == {"a-1"})
        soon = time.time() + 0.3  # the reserve run's own deadline, as its run start gives it
        await queue.submit([Submission("b-1", request("b-1"), soon)], claim=Claim("run-b", 1))
        assert math.isinf(await queue.deadline_of("run-b", soon))  # no deadline while in reserve
        await asyncio.sleep(0.5)  # past its given deadline, still in reserve: not refused
        assert queue._turns["b-1"].result is None
        engine.finish("a-1")
        await until(lambda: queue._turns["a-1"].result is not None)
        await queue.release("run-a")
        moved = await queue.deadline_of("run-b", soon)
        assert moved > time.time()  # moved by the time it waited in reserve
        await until(lambda: engine.running() == {"b-1"})
        engine.finish("b-1")
        await until(lambda: queue._turns["b-1"].result is not None)
        assert queue._turns["b-1"].result.status is TurnStatus.COMPLETED

    asyncio.run(scenario())


def test_runs_whose_councils_fit_together_all_hold_the_engine_and_turns_without_a_claim_never_wait():
    async def scenario() -> None:
        queue, engine = new_queue(capacity=4)
        deadline = time.time() + 600
        await queue.submit(
            [Submission(k, request(k), deadline) for k in ("a-1", "a-2")], claim=Claim("run-a", 2)
        )
        await queue.submit(
            [Submission(k, request(k), deadline) for k in ("b-1", "b-2")], claim=Claim("run-b", 2)
        )
        await queue.submit(
            [Submission(k, request(k), deadline) for k in ("c-1", "c-2")], claim=Claim("run-c", 2)
        )
        assert queue.stats()["holding"] == ["run-a", "run-b"] and queue.stats()["reserve"] == ["run-c"]
        await until(lambda: engine.running() == {"a-1", "a-2", "b-1", "b-2"})
        engine.finish("a-1")
        await until(lambda: "c-1" in engine.running())  # an idle slot goes to the reserve
        # A turn without a claim (an evaluation's) is served like a holder's.
        await queue.submit([Submission("e-1", request("e-1"), deadline)])
        await until(lambda: "e-1" in engine.running())
        assert ("cancelled", "c-1") in engine.log
        engine.finish("a-2", "b-1", "b-2", "c-1", "c-2", "e-1")
        keys = ("a-2", "b-1", "b-2", "c-1", "c-2", "e-1")
        await until(lambda: all(queue._turns[k].result is not None for k in keys))
        assert all(queue._turns[k].result.status is TurnStatus.COMPLETED for k in keys)

    asyncio.run(scenario())


def test_a_poll_answers_typed_news_and_a_resubmission_the_queue_holds_runs_once():
    """The wire's values: `poll` answers `TurnNews` per turn (the chunks after its cursor, then its
    result; a turn the queue does not hold, as after a restart, not `known`), and a `Submission`
    the queue already holds is not run again."""

    async def scenario() -> None:
        queue, engine = new_queue(capacity=1)
        turn = Submission("a-1", request("a-1"), time.time() + 600)
        await queue.submit([turn], claim=Claim("run-a", 1))
        await until(lambda: "a-1" in engine.running())
        first = await queue.poll({"a-1": 0, "gone-1": 0}, 1.0)
        assert first["gone-1"] == TurnNews(known=False)
        assert first["a-1"] == TurnNews(True, (("a-1 attempt 1. ", 1),), None)
        await queue.submit([turn], claim=Claim("run-a", 1))  # as a retried submit call would
        engine.finish("a-1")
        await until(lambda: queue._turns["a-1"].result is not None)
        news = (await queue.poll({"a-1": 1}, 1.0))["a-1"]
        assert news.known and news.chunks == () and news.result is not None
        assert news.result.content == "a-1 attempt 1, done" and engine.attempts["a-1"] == 1

    asyncio.run(scenario())
