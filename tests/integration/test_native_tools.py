"""Native tool calling on the real llama.cpp server (SmolLM2-135M, our ChatML tools template): a
call the model writes is streamed as OpenAI `tool_calls` deltas, assembled by the engine client,
run in the sandbox against a real workspace, answered as a `tool` message, and the turn goes on
with a second engine call that carries that answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path

import pytest

from fleet_pipelines.domain.models import (
    Message,
    RepoSpec,
    Role,
    TurnKind,
    TurnRequest,
    TurnResult,
    TurnStatus,
)
from fleet_pipelines.evaluation.repo_suite import REPO_CASES, create_repo
from fleet_pipelines.llm.engine import ChatCall, ChatEngine, Completion
from fleet_pipelines.llm.local_server import MODEL_NAME
from fleet_pipelines.llm.settings import EngineSettings
from fleet_pipelines.resources.repos import ReposResource
from fleet_pipelines.sandbox import isolation_available

pytestmark = pytest.mark.skipif(not isolation_available()[0], reason="needs the bubblewrap sandbox")

CASE = REPO_CASES[0]  # calc-add
Stream = Callable[[ChatCall], Coroutine[object, object, Completion]]  # an engine's `stream`
# SmolLM2-135M does not choose tools by itself; it copies a call it is shown, which is what the
# engine has to parse: the test is of the plumbing, not of the model's judgement.
COPY_A_CALL = (
    "Copy this text exactly, nothing else:\n<tool_call>\n"
    '{"name": "read_file", "arguments": {"path": "calc.py"}}\n</tool_call>'
)


def native_call_turn(
    stream: Stream, tmp_path: Path, workspaces: Path
) -> tuple[TurnResult, list[TurnRequest]]:
    """One proposal turn with native tools (`tool_protocol: openai`) on a real workspace of
    calc-add, each engine call through `stream` (an engine's `stream`); the result and the
    requests sent. Shared with the vLLM tests (test_vllm_engines.py)."""
    repo = create_repo(CASE, tmp_path / "calc")
    repos = ReposResource(root=str(workspaces))
    workspace = repos.prepare("native-tools-1", RepoSpec(url=str(repo), ref="main"))
    sent: list[TurnRequest] = []

    def run_step(requests: Sequence[TurnRequest]) -> list[TurnResult]:
        results = []
        for r in requests:
            sent.append(r)
            done = asyncio.run(stream(ChatCall.for_request(r)))
            results.append(
                TurnResult.for_request(
                    r, TurnStatus.COMPLETED, content=done.content, tokens_out=done.tokens_out
                )
            )
        return results

    request = TurnRequest(
        task_id="native-tools-1",
        agent_id="agent-dev-001",
        role=Role.DEV,
        kind=TurnKind.PROPOSE,
        round=0,
        messages=[Message(role="user", content=COPY_A_CALL)],
        temperature=0.0,
        max_tokens=60,
    )
    [result] = repos.tool_runner(run_step, workspace, "openai")([request])
    return result, sent


def assert_called_run_and_answered(result: TurnResult, sent: list[TurnRequest], ids: bool = True) -> None:
    """The call was offered natively, run in the sandbox (the file's text came back) and answered
    as `tool` messages naming each call (the engine's own ids where `ids`), and the turn went on."""
    first, second = sent[0], sent[1]
    assert first.tools and {t["function"]["name"] for t in first.tools} >= {"read_file", "run_tests"}
    step = result.tool_steps[0]
    assert (step.name, step.arguments, step.parsed) == ("read_file", {"path": "calc.py"}, True)
    assert "def add(a, b):" in step.output and "return a - b" in step.output  # read in the sandbox
    [at] = [n for n, m in enumerate(second.messages) if m.role == "assistant" and m.tool_calls]
    assistant, answers = second.messages[at], second.messages[at + 1 :]
    names = [c["function"]["name"] for c in assistant.tool_calls]
    assert names == [s.name for s in result.tool_steps[: len(answers)]]
    assert answers and all(a.role == "tool" for a in answers)
    assert [a.tool_call_id for a in answers] == [c["id"] for c in assistant.tool_calls]
    if ids:
        assert all(c["id"] and not c["id"].startswith("call_0") for c in assistant.tool_calls[:1])
    assert "def add(a, b):" in answers[0].content
    assert result.engine_calls >= 2 and result.status is TurnStatus.COMPLETED  # the turn went on


def test_a_native_call_is_streamed_assembled_run_in_the_sandbox_and_answered(
    llm_server: str, tmp_path: Path, traversable_dir: Path
):
    engine = ChatEngine(EngineSettings(base_url=llm_server, model=MODEL_NAME, tool_protocol="openai"))
    result, sent = native_call_turn(engine.stream, tmp_path, traversable_dir)
    assert_called_run_and_answered(result, sent)  # llama.cpp's ids, carried through
