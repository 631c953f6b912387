"""Engine and Ray faults: errors retried with backoff, busy never retried, stalls cut by the
first-token and idle clocks, a killed admission-queue actor re-run. The engine faults use
FakeOpenAIServer (llama.cpp can't 5xx or hang on cue); Ray is real."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

from fleet_pipelines.dispatch.admission import execute_turn, make_engine
from fleet_pipelines.dispatch.ray_dispatch import DispatchSettings, RayTurnDispatcher, engine_queue
from fleet_pipelines.domain.councils import CouncilSettings, build_council
from fleet_pipelines.domain.deliberation import TurnContext, proposal_requests
from fleet_pipelines.domain.models import Role, Task, TurnStatus
from fleet_pipelines.llm.engine import EngineSettings
from tests.fakes import FakeOpenAIServer, Fault

TASK = Task(task_id="faults-1", description="Write add(a, b).", role=Role.DEV, num_agents=1, rounds=0)
SETTINGS = CouncilSettings(max_tokens=32)
REQUEST = proposal_requests(TASK, build_council(Role.DEV, 1, SETTINGS), SETTINGS)[0]


def engine(url: str, **overrides) -> EngineSettings:
    fields = {
        "base_url": url,
        "model": "fake",
        "first_token_timeout_s": 2.0,
        "idle_timeout_s": 2.0,
        "max_attempts": 3,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
    }
    return EngineSettings(**{**fields, **overrides})


def run_turn(settings: EngineSettings, request=REQUEST):
    """One turn sent straight to the engine, without Ray or admission."""
    return asyncio.run(execute_turn(make_engine(settings), request))


def test_transient_5xx_is_retried_and_attempts_are_recorded():
    with FakeOpenAIServer([Fault(status=503), Fault(status=500), Fault()]).running() as fake:
        result = run_turn(engine(fake.base_url), REQUEST)
    assert result.status is TurnStatus.COMPLETED
    assert result.attempts == 3 and len(fake.requests) == 3
    assert "def add" in result.content


def test_persistent_5xx_fails_the_turn_with_its_error_type():
    with FakeOpenAIServer([Fault(status=500)]).running() as fake:
        result = run_turn(engine(fake.base_url), REQUEST)
    assert result.status is TurnStatus.FAILED
    assert result.error_type == "InternalServerError"
    assert result.attempts == 3 and len(fake.requests) == 3
    assert "failed after 3 attempts" in result.error


def test_a_request_error_is_not_retried():
    with FakeOpenAIServer([Fault(status=400)]).running() as fake:
        result = run_turn(engine(fake.base_url), REQUEST)
    assert result.status is TurnStatus.FAILED
    assert result.error_type == "BadRequestError" and len(fake.requests) == 1


def test_busy_429_is_never_retried():
    with FakeOpenAIServer([Fault(status=429), Fault()]).running() as fake:
        result = run_turn(engine(fake.base_url), REQUEST)
    assert result.status is TurnStatus.FAILED and result.error_type == "RateLimitError"
    assert len(fake.requests) == 1


def test_no_first_token_in_time_fails_the_turn_without_a_retry():
    with FakeOpenAIServer([Fault(delay_s=5), Fault()]).running() as fake:
        result = run_turn(engine(fake.base_url, first_token_timeout_s=0.5), REQUEST)
    assert result.status is TurnStatus.FAILED and result.error_type == "FirstTokenTimeout"
    assert len(fake.requests) == 1


def test_a_stream_that_stalls_between_tokens_is_cut_by_the_idle_timeout():
    content = "".join(f"line {i}\n" for i in range(10))
    with FakeOpenAIServer([Fault(content=content, stall_after=3)]).running() as fake:
        result = run_turn(engine(fake.base_url, idle_timeout_s=0.5), REQUEST)
    assert result.status is TurnStatus.FAILED and result.error_type == "IdleTimeout"
    assert len(fake.requests) == 1


def test_a_slow_answer_that_keeps_streaming_is_never_cut():
    content = "".join(f"line {i}\n" for i in range(6))
    with FakeOpenAIServer([Fault(content=content, delay_s=1.0)]).running() as fake:
        # 1 s to the first token, then the stream flows: within both clocks, though the whole
        # answer takes longer than either.
        result = run_turn(engine(fake.base_url, first_token_timeout_s=1.5, idle_timeout_s=1.5), REQUEST)
    assert result.status is TurnStatus.COMPLETED and result.content == content
    assert result.first_token_ms >= 1000 and result.attempts == 1


def test_turns_sent_back_to_back_to_an_engine_that_closes_after_each_stream_need_one_attempt():
    """llama.cpp closes a streamed reply's connection right after its last chunk while advertising
    keep-alive: a turn sent at once on that pooled connection was lost and retried after a
    backoff. Each request on its own connection, every turn goes through on its first attempt."""
    with FakeOpenAIServer([Fault(close_after_s=0.5)]).running() as fake:

        async def back_to_back():
            one_engine = make_engine(engine(fake.base_url, max_attempts=3))
            return [await execute_turn(one_engine, REQUEST) for _ in range(4)]

        results = asyncio.run(back_to_back())
    assert [r.status for r in results] == [TurnStatus.COMPLETED] * 4
    assert [r.attempts for r in results] == [1, 1, 1, 1]
    assert len(fake.requests) == 4 and all("def add" in r.content for r in results)


def test_engine_down_fails_after_retries_with_connection_error():
    from fleet_pipelines.stack import free_port

    result = run_turn(engine(f"http://127.0.0.1:{free_port()}/v1"), REQUEST)
    assert result.status is TurnStatus.FAILED and result.error_type == "APIConnectionError"


def test_killed_queue_actor_is_restarted_and_the_turn_rerun(ray_head):
    import ray

    ray.init(ignore_reinit_error=True, log_to_driver=False)
    with FakeOpenAIServer([Fault(delay_s=4), Fault()]).running() as fake:
        settings = engine(fake.base_url, first_token_timeout_s=10)
        # This test's own queue, by its process id: the other xdist worker runs queue actors of its
        # own (on its own cluster), which a kill of every `ray::EngineQueue` process would hit.
        queue = engine_queue(settings, DispatchSettings())
        pid = ray.get(queue.__ray_call__.remote(lambda _: os.getpid()))
        killed: list[int] = []

        def kill_queue_mid_turn() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not fake.requests:
                time.sleep(0.05)
            if fake.requests:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        killer = threading.Thread(target=kill_queue_mid_turn)
        killer.start()
        dispatcher = RayTurnDispatcher(settings, DispatchSettings(), TurnContext(deadline=time.time() + 60))
        [result] = dispatcher([REQUEST])
        killer.join()
    assert killed, "the turn never reached the engine"
    assert result.status is TurnStatus.COMPLETED
    # The first attempt died with the actor; Ray restarted it and the turn was submitted again.
    assert len(fake.requests) == 2
    assert ray.get(queue.__ray_call__.remote(lambda _: os.getpid())) != pid


def test_deadline_cancels_unfinished_turns_as_timeout(ray_head):
    import ray

    ray.init(ignore_reinit_error=True, log_to_driver=False)
    with FakeOpenAIServer([Fault(delay_s=40)]).running() as fake:
        dispatcher = RayTurnDispatcher(
            engine(fake.base_url, first_token_timeout_s=60, max_attempts=1),
            # A queue of its own: one that learnt a slow pace from an earlier fake on the same port
            # would (rightly) not send the turn at all.
            DispatchSettings(capacity=2),
            TurnContext(deadline=time.time() + 10),  # room to create the queue actor on a loaded machine
        )
        start = time.monotonic()
        [result] = dispatcher([REQUEST])
        waited = time.monotonic() - start
    assert result.status is TurnStatus.TIMEOUT and result.error_type == "Timeout"
    assert "stream closed" in result.error
    assert waited < 30  # cut at the deadline, not after the engine's 40 s
