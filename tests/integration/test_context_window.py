"""Every request fits the engine's window, on the real llama.cpp server (SmolLM2-135M): the window
is read from the server, requests are counted by the server's own template and tokenizer (the
count a completion's usage reports, and the count llama.cpp gives when it refuses), an oversized
request is never sent, and a task on a real project (inflection 0.5.1 from its pinned PyPI sdist,
a bug put in) ends with proposals and no request over the window."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

from fleet_pipelines.assets.deliberation import materialize_deliberation
from fleet_pipelines.domain.models import DeliberationStatus, Message, TurnKind
from fleet_pipelines.evaluation.project_tasks import PROJECT_TASKS, project_repo, project_task_fields
from fleet_pipelines.llm.engine import (
    ChatCall,
    ChatEngine,
    EngineError,
    EngineMeter,
    context_exceeded,
    engine_window,
)
from fleet_pipelines.llm.local_server import MODEL_NAME
from fleet_pipelines.llm.settings import EngineSettings
from fleet_pipelines.resources.repos import ReposResource, StepBudgetConfig
from fleet_pipelines.sandbox import isolation_available


def call(words: int, max_tokens: int = 8) -> ChatCall:
    return ChatCall(
        messages=(Message(role="system", content="Be brief."), Message(role="user", content="word " * words)),
        temperature=0.0,
        max_tokens=max_tokens,
    )


def test_an_oversized_request_is_counted_by_the_engine_and_never_sent(llm_server: str):
    settings = EngineSettings(base_url=llm_server, model=MODEL_NAME)
    meter = EngineMeter.of(settings)
    assert meter is not None and meter.window == engine_window(llm_server) == 4096  # per slot
    engine = ChatEngine(settings)

    small = call(50)
    done = asyncio.run(engine.stream(small))
    assert meter.count_call(small) == done.tokens_in  # the engine's own count, as its usage says

    capped = meter.fit(call(3_000, max_tokens=4_000))
    assert capped.max_tokens == 4096 - meter.count_call(capped)  # the reply gets what is left

    big = call(5_000)
    counted = meter.count_call(big)
    with pytest.raises(EngineError) as refused:
        asyncio.run(engine.stream(big))
    assert refused.value.kind == "ContextExceeded" and refused.value.attempts == 0
    assert f"request ({counted} tokens)" in str(refused.value) and "not sent" in str(refused.value)

    # Sent anyway, past the meter: llama.cpp refuses it with the same count, and its refusal is
    # recognised as the window's.
    client = openai.OpenAI(base_url=llm_server, api_key="none")
    with pytest.raises(openai.BadRequestError) as server_refused:
        client.chat.completions.create(
            model=MODEL_NAME, messages=[m.wire() for m in big.messages], max_tokens=8
        )
    assert context_exceeded(server_refused.value)
    assert server_refused.value.body["n_prompt_tokens"] == counted


@pytest.mark.skipif(not isolation_available()[0], reason="needs the bubblewrap sandbox")
def test_a_real_project_task_ends_with_proposals_within_the_window(
    stack_env, dagster_instance, traversable_dir: Path, tmp_path: Path
):
    task = next(t for t in PROJECT_TASKS if t.name == "inflection-underscore")
    repo = project_repo(task, tmp_path / "inflection")
    repos = ReposResource(root=str(traversable_dir), step_budget=StepBudgetConfig(max_tool_calls=2))
    result = materialize_deliberation(
        dagster_instance,
        {**stack_env, "repos": repos},
        "context-inflection",
        project_task_fields(task, repo, agents=2, rounds=0),
        raise_on_error=False,
    )
    assert result.success
    proposals = result.output_for_node("proposals")
    assert [t.kind for t in proposals] == [TurnKind.PROPOSE, TurnKind.PROPOSE]
    assert not [t.error for t in proposals if t.error_type == "ContextExceeded"]
    assert all(0 < t.largest_prompt <= 4096 - 32 for t in proposals)
    assert any(t.ok for t in proposals)
    decision = result.output_for_node("decision")
    assert decision.status in (DeliberationStatus.COMPLETED, DeliberationStatus.PARTIAL), decision.reasons
    view = result.output_for_node("council").task.workspace_view
    assert "inflection.egg-info" not in view and "def underscore" in view  # seeded by the failing tests
