"""Admission and streaming against the real llama.cpp server (3 slots), Ray and Dagster.

The engine is the scarce resource: turns beyond its slots wait in one queue per engine without
failing, an abandoned turn closes its stream, a turn that cannot make its deadline is never sent,
and the tokens of each turn reach `vllm.streaming.{task_id}` in order. The same through Ray Client,
as deploy/ connects runs (two runs sharing one queue, their tokens streamed back), is checked on the
deployment's head in test_ray_auth.py, where that head is started once for all its Ray Client checks.
"""

from __future__ import annotations

import json
import math
import time
import urllib.request

import dagster as dg
import pytest

from fleet_pipelines.assets.deliberation import materialize_deliberation
from fleet_pipelines.dispatch.admission import NOT_STARTED, Submission
from fleet_pipelines.dispatch.ray_dispatch import DispatchSettings, RayTurnDispatcher, engine_queue
from fleet_pipelines.domain.councils import CouncilSettings, build_council
from fleet_pipelines.domain.deliberation import TurnContext, proposal_requests
from fleet_pipelines.domain.models import Role, Task, TurnRequest, TurnStatus
from fleet_pipelines.events.streams import streaming_subject
from fleet_pipelines.llm.engine import EngineSettings
from fleet_pipelines.llm.local_server import MODEL_NAME


def proposals(task_id: str, agents: int, max_tokens: int) -> list[TurnRequest]:
    settings = CouncilSettings(max_tokens=max_tokens)
    task = Task(
        task_id=task_id,
        description="Write merge_intervals(intervals) in Python.",
        role=Role.DEV,
        num_agents=agents,
    )
    return proposal_requests(task, build_council(Role.DEV, agents, settings), settings)


def slot_holder(task_id: str) -> TurnRequest:
    """A turn that holds its slot for tens of seconds whatever the model would say: the engine's
    grammar for this JSON schema forbids the reply's end before 1,000 numbers (2,000+ tokens;
    a plain 3,000-token proposal ended after ~200 tokens in 1 try of 8 and freed the slot)."""
    [request] = proposals(task_id, 1, 3000)
    numbers = {"type": "array", "items": {"type": "integer"}, "minItems": 1000}
    schema = {"type": "object", "properties": {"numbers": numbers}, "required": ["numbers"]}
    return request.model_copy(update={"response_schema": schema})


def still_running(queue, turn_id: str) -> bool:
    import ray

    news = ray.get(queue.poll.remote({turn_id: 0}, 0.0)).get(turn_id)
    return news is None or news.result is None


def engine(url: str) -> EngineSettings:
    return EngineSettings(base_url=url, model=MODEL_NAME, first_token_timeout_s=30, idle_timeout_s=30)


def slots_processing(url: str) -> int:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/slots", timeout=5) as response:
        return sum(slot["is_processing"] for slot in json.load(response))


def wait_for_first_chunk(queue, turn_id: str, timeout_s: float = 60) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        news = ray.get(queue.poll.remote({turn_id: 0}, 1.0)).get(turn_id)
        if news is not None and news.chunks:
            return
    raise AssertionError(f"{turn_id} streamed nothing in {timeout_s} s")


@pytest.fixture
def connected(ray_head: str) -> None:
    import ray

    ray.init(ignore_reinit_error=True, log_to_driver=False)


def test_more_turns_than_slots_complete_without_a_timeout(llm_server: str, connected):
    import ray

    requests = [r for i in range(4) for r in proposals(f"slots-{i}", 3, 48)]  # 12 turns, 3 slots
    settings = DispatchSettings()  # capacity from llama.cpp's /props
    results = RayTurnDispatcher(engine(llm_server), settings, TurnContext(deadline=time.time() + 600))(
        requests
    )
    assert [r.status for r in results] == [TurnStatus.COMPLETED] * 12, [r.error for r in results]
    stats = ray.get(engine_queue(engine(llm_server), settings).stats.remote())
    assert stats["capacity"] == 3 and stats["peak_running"] == 3
    # Nine turns waited for a slot, each at least as long as the quickest turn took to serve.
    quickest = min(r.latency_ms for r in results)
    assert sum(r.queue_ms >= quickest for r in results) >= 9


def test_a_queue_left_idle_ends_and_the_next_batch_starts_it_again(llm_server: str, connected):
    """A detached queue nobody asks anything ends after `idle_exit_s` (a deploy's new code version
    would otherwise leave the old version's queue actor on the cluster for good); the next batch
    for its engine starts a new one, and its turns complete."""
    import ray

    from fleet_pipelines.dispatch.ray_dispatch import WORKER_NAMESPACE, code_version, queue_name

    # capacity=3, set: a queue of its own (the name carries it), not the one other tests share.
    settings = DispatchSettings(capacity=3, idle_exit_s=1.0)
    name = queue_name(engine(llm_server), 3, code_version())

    def batch(task_id: str) -> list[TurnStatus]:
        turn = TurnContext(deadline=time.time() + 300)
        return [
            r.status for r in RayTurnDispatcher(engine(llm_server), settings, turn)(proposals(task_id, 2, 16))
        ]

    def live_queue() -> str | None:
        """The id of the live actor of that name (asking it nothing)."""
        try:
            return ray.get_actor(name, namespace=WORKER_NAMESPACE)._actor_id.hex()
        except ValueError:
            return None

    assert batch("idle-1") == [TurnStatus.COMPLETED] * 2
    first = live_queue()
    assert first is not None
    deadline = time.monotonic() + 30
    while live_queue() is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert live_queue() is None, "the idle queue is still up"
    assert batch("idle-2") == [TurnStatus.COMPLETED] * 2
    assert live_queue() not in (None, first)


def test_an_abandoned_turn_closes_its_stream(llm_server: str, connected):
    import ray

    queue = engine_queue(engine(llm_server), DispatchSettings())
    ray.get(queue.submit.remote([Submission("abandoned-1", slot_holder("abandoned-1"), math.inf)]))
    wait_for_first_chunk(queue, "abandoned-1")
    assert slots_processing(llm_server) == 1
    assert ray.get(queue.abandon.remote(["abandoned-1"])) == 1
    deadline = time.monotonic() + 15
    while slots_processing(llm_server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slots_processing(llm_server) == 0, "the engine still generates for the abandoned turn"


def test_a_turn_that_cannot_make_its_deadline_is_timeout_without_being_sent(llm_server: str, connected):
    import ray

    settings = DispatchSettings(capacity=1)  # one slot, held by a long turn
    queue = engine_queue(engine(llm_server), settings)
    ray.get(queue.submit.remote([Submission("long-1", slot_holder("long-1"), math.inf)]))
    wait_for_first_chunk(queue, "long-1")
    try:
        [result] = RayTurnDispatcher(engine(llm_server), settings, TurnContext(deadline=time.time() + 2))(
            proposals("short-1", 1, 32)
        )
        stats = ray.get(queue.stats.remote())
        assert still_running(queue, "long-1"), "the long turn gave its slot up: the test proves nothing"
    finally:
        ray.get(queue.abandon.remote(["long-1"]))
    assert result.status is TurnStatus.TIMEOUT and result.error_type == NOT_STARTED
    assert result.error.startswith("not sent: no free engine slot before the deadline")
    assert result.attempts == 0 and result.queue_ms >= 1000
    assert stats["sent"] == 1 and stats["not_started"] == 1  # only the long turn reached the engine


def streamed_turns(nats_resource, task_id: str) -> dict[tuple, list[dict]]:
    async def read(session) -> list[dict]:
        out = []
        async for message in session.read_after(
            "VLLM_STREAMING", streaming_subject(task_id), 0, 10_000, time.monotonic() + 10
        ):
            out.append(json.loads(message.data)["payload"])
        return out

    turns: dict[tuple, list[dict]] = {}
    for chunk in nats_resource.session(read):
        turns.setdefault((chunk["agent_id"], chunk["kind"], chunk["target_agent_id"]), []).append(chunk)
    return turns


def test_the_streaming_subject_carries_each_turns_tokens_in_order(
    stack_env: dict, dagster_instance: dg.DagsterInstance, nats_resource
):
    task_id = "streamed-1"
    config = {"description": "Write add(a, b) in Python.", "role": "DEV", "num_agents": 2, "rounds": 0}
    result = materialize_deliberation(dagster_instance, stack_env, task_id, config)
    turns = streamed_turns(nats_resource, task_id)
    for proposal in result.output_for_node("proposals"):
        chunks = turns[(proposal.agent_id, "propose", None)]
        assert [c["seq"] for c in chunks] == list(range(len(chunks)))  # stored in order, none lost
        assert "".join(c["text"] for c in chunks) == proposal.content
        assert chunks[-1]["done"] and chunks[-1]["status"] == "completed"
        assert not any(c["done"] for c in chunks[:-1])
        assert len(chunks) > 2  # chunks, not one message per turn
    assert {kind for _, kind, _ in turns} == {"propose", "judge"}  # judge turns stream too
    # The run log has each turn with its queue wait beside its service time.
    lines = [
        e.user_message for e in dagster_instance.all_logs(result.run_id) if e.user_message.startswith("turn ")
    ]
    assert any(line.startswith("turn agent-dev-001 propose r0: completed") for line in lines)
    assert all(" queue " in line and " service " in line for line in lines)


def test_reviews_go_to_the_slot_that_wrote_their_proposal_and_reuse_its_prompt(llm_server: str):
    """The queue sends a proposal's critiques and revision to the llama.cpp slot that holds its
    conversation (`id_slot`) whenever that slot is free: llama.cpp reports the prompt tokens it did
    not compute again (`cached_tokens`), at least the whole proposal conversation."""
    import asyncio

    from fleet_pipelines.dispatch.admission import EngineQueue
    from fleet_pipelines.domain.deliberation import critique_requests, revision_requests

    settings = CouncilSettings(max_tokens=24)
    task = Task(
        task_id="affinity", description="Write add(a, b) in Python.", role=Role.DEV, num_agents=3, rounds=1
    )
    council = build_council(Role.DEV, 3, settings)

    async def run_all() -> tuple[EngineQueue, list, list, list, set]:
        queue = EngineQueue(engine(llm_server))
        assert queue.capacity == 3 and queue.pin_slots

        async def phase(requests: list[TurnRequest]) -> list:
            ids = [f"{r.kind.value}-{r.agent_id}-{r.target_agent_id}" for r in requests]
            deadline = time.time() + 300  # one run's deadline
            await queue.submit([Submission(i, r, deadline) for i, r in zip(ids, requests, strict=True)])
            await asyncio.gather(*(queue._turns[i].task for i in ids))  # each turn's run to its result
            return [queue._turns[i] for i in ids]

        written = await phase(proposal_requests(task, council, settings))
        current = {turn.result.agent_id: turn.result for turn in written}
        critiqued = await phase(critique_requests(task, council, settings, 1, current))
        held = set(queue.scheduler._slot_holds.values())  # the conversations the (all free) slots hold now
        results = [turn.result for turn in critiqued]
        revised = await phase(revision_requests(task, council, settings, 1, current, results))
        return queue, written, critiqued, revised, held

    queue, written, critiqued, revised, held = asyncio.run(run_all())
    assert all(t.result.ok for t in [*written, *critiqued, *revised])
    assert sorted(t.slot for t in written) == [0, 1, 2]  # three proposals, one per slot
    # 6 critiques for 3 slots: the first three each find their proposal's slot free; a later one
    # goes home when its slot frees first, elsewhere when another slot does (work goes on).
    assert sum(t.slot_reused for t in critiqued) >= 3, [(t.slot, t.turn_id) for t in critiqued]
    # 3 revisions, 3 free slots: each goes to the slot holding its conversation, if one still does
    # (a critique sent elsewhere replaced that slot's conversation with its own).
    for turn in revised:
        assert turn.slot_reused == (turn.request.conversation in held), turn.turn_id
    # What a review in a slot holding its conversation read from the cache: at least the
    # proposal's conversation (its prompt and its reply), less a token or two where the reply's
    # text tokenizes differently from the tokens generated.
    proposal_tokens = {t.result.agent_id: t.result.tokens_in + t.result.tokens_out for t in written}
    for turn in [t for t in [*critiqued, *revised] if t.slot_reused]:
        review = turn.result
        author = review.target_agent_id or review.agent_id
        assert review.tokens_cached >= proposal_tokens[author] - 2, (review.kind, review.tokens_cached)
    assert queue.stats()["slot_reused"] == sum(t.slot_reused for t in [*written, *critiqued, *revised])
    assert queue.counts["sent"] == 12
