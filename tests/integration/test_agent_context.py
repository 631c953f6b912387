"""What agents know, against the real local engine (llama.cpp, SmolLM2-135M) on a real Ray head:
their own code's check results when they revise; their story's context and earlier decisions."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import Field

from fleet_pipelines.assets.deliberation import materialize_deliberation
from fleet_pipelines.assets.story import STORY_DECISIONS, story_context
from fleet_pipelines.dispatch.ray_dispatch import DispatchSettings, RayTurnDispatcher
from fleet_pipelines.domain.councils import CouncilSettings, build_council
from fleet_pipelines.domain.deliberation import TurnContext, review_rounds
from fleet_pipelines.domain.limits import SandboxLimits
from fleet_pipelines.domain.models import Role, Task, TurnKind, TurnRequest, TurnResult
from fleet_pipelines.llm.engine import EngineSettings
from fleet_pipelines.llm.local_server import MODEL_NAME
from fleet_pipelines.resources.turns import RayTurnRunner
from fleet_pipelines.scoring.code import execution_checks
from tests.factories import turn
from tests.scripted import record, recorded

WRONG_ADD = "## Implementation details\n```python\ndef add(a, b):\n    return a - b\n```\n"


def test_an_authors_revision_prompt_carries_its_failing_test(llm_server, ray_head):
    import ray

    ray.init(ignore_reinit_error=True, log_to_driver=False)
    task = Task(
        task_id="feedback-add",
        description="Write add(a, b) returning the sum.",
        role=Role.DEV,
        num_agents=2,
        rounds=1,
        constraints={"tests": "def test_sum():\n    assert add(2, 3) == 5\n"},
    )
    settings = CouncilSettings(max_tokens=64)
    council = build_council(task.role, task.num_agents, settings)
    proposals = [  # round 0 as given; the engine writes the critiques and revisions
        turn(agent.agent_id, WRONG_ADD, task_id=task.task_id, role=task.role) for agent in council
    ]
    engine = RayTurnDispatcher(
        EngineSettings(base_url=llm_server, model=MODEL_NAME),
        DispatchSettings(),
        TurnContext(deadline=time.time() + 240),
    )
    sent: list[TurnRequest] = []

    def run_turns(requests):
        sent.extend(requests)
        return engine(requests)

    limits = SandboxLimits(wall_s=10, cpu_s=3)
    history = review_rounds(
        task, council, settings, proposals, run_turns, lambda t, text: execution_checks(t, text, limits)
    )
    revisions = [r for r in sent if r.kind is TurnKind.REVISE]
    assert len(revisions) == 2
    for request in revisions:
        prompt = request.messages[-1].content
        assert "- tests: FAILED: 0/1 tests passed" in prompt
        assert "FAIL test_sum" in prompt
    assert any(t.kind is TurnKind.REVISE and t.ok for t in history)


class RecordingRayTurnRunner(RayTurnRunner):
    """The stack's runner, writing down every request it sends to the engine."""

    record_to: str = Field(description="File each request is appended to.")

    def run_turns(self, requests: Sequence[TurnRequest], turn: TurnContext) -> list[TurnResult]:
        record(self.record_to, requests)
        return super().run_turns(requests, turn)


def test_a_story_of_two_tasks_carries_the_plans_story_and_the_first_decision_into_the_second(
    stack_env, dagster_instance, tmp_path: Path
):
    """Two tasks of one story, two agents each, on the real engine. What is asserted is what the
    prompts carry, not what the model answers: the proposals are held to 32 completion tokens
    (the stack's tests use 64)."""
    from fleet_pipelines.resources.council import CouncilResource

    log = tmp_path / "requests.jsonl"
    runner = stack_env["turn_runner"]
    resources = {
        **stack_env,
        "turn_runner": RecordingRayTurnRunner(
            engine=runner.engine, ray_cluster=runner.ray_cluster, record_to=str(log)
        ),
        "council": CouncilResource(max_tokens=32),
    }
    story = {
        "role": "DEV",
        "num_agents": 2,
        "rounds": 0,
        "story_id": "US-real-1",
        "plan_id": "P-real-1",
        "story_title": "Interval tools",
        "story_description": "A library of helpers for closed integer intervals.",
        "acceptance_criteria": ["intervals are (start, end) tuples"],
    }
    first = materialize_deliberation(
        dagster_instance, resources, "story-t1", {**story, "description": "Write overlaps(a, b)."}
    )
    decision = first.output_for_node("decision")
    assert decision.winner_id
    sent_first = len(recorded(log))
    second = materialize_deliberation(
        dagster_instance, resources, "story-t2", {**story, "description": "Write merge(intervals)."}
    )
    assert second.success
    first_prompts = [r.messages[-1].content for r in recorded(log)[:sent_first] if r.kind is TurnKind.PROPOSE]
    second_prompts = [
        r.messages[-1].content for r in recorded(log)[sent_first:] if r.kind is TurnKind.PROPOSE
    ]
    assert first_prompts and second_prompts
    for prompt in first_prompts + second_prompts:  # the plan's story context reaches the prompts
        assert "Title: Interval tools" in prompt and "- intervals are (start, end) tuples" in prompt
    for prompt in second_prompts:  # and the first task's decision reaches the second's
        assert f"(decision of story-t1 (run {first.run_id[:8]})) " in prompt
        assert f"winner {decision.winner_id}" in prompt
    assert all("Decisions already taken" not in p for p in first_prompts)
    # Through lineage: story_context depends on story_decisions in the asset graph.
    assert STORY_DECISIONS in story_context.dependency_keys


def _launched(log: Path) -> int:
    """Requests a llama.cpp server has started decoding (one `launch_slot_` line each)."""
    return log.read_text(errors="replace").count("launch_slot_") if log.exists() else 0


@pytest.mark.heavy(36)
def test_a_councils_file_routes_each_roles_turns_to_its_engine(
    ray_head, dagster_instance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from fleet_pipelines import stack, wiring
    from fleet_pipelines.settings import FleetSettings

    servers, logs = {}, {}
    for name in ("coder", "tester"):
        logs[name] = tmp_path / name
        port = stack.free_port()
        servers[name] = (stack.start_model_server(logs[name], port, parallel=2), port)
    try:
        councils = tmp_path / "councils.yaml"
        councils.write_text(
            'version: "two-engines-1"\nengines:\n'
            + "".join(
                f"  {name}: {{base_url: 'http://127.0.0.1:{port}/v1', model: {MODEL_NAME}}}\n"
                for name, (_, port) in servers.items()
            )
            + "councils:\n  DEV: {engine: coder, max_tokens: 48}\n  QA: {engine: tester, max_tokens: 48}\n"
        )
        monkeypatch.setenv("FLEET_COUNCILS_FILE", str(councils))
        monkeypatch.setenv("FLEET_LLM_BASE_URL", f"http://127.0.0.1:{stack.free_port()}/v1")  # nobody there
        monkeypatch.setenv("FLEET_STORAGE_PATH", str(tmp_path / "storage"))
        resources = wiring.resources(FleetSettings.from_env())
        fields = {"description": "Write add(a, b).", "num_agents": 2, "rounds": 0}
        counts = []
        for role in ("DEV", "QA"):
            result = materialize_deliberation(
                dagster_instance, resources, f"route-{role.lower()}", {**fields, "role": role}
            )
            assert result.success
            assert all(p.ok for p in result.output_for_node("proposals")), role
            counts.append({name: _launched(logs[name] / "model-server.log") for name in servers})
            [meta] = result.asset_materializations_for_node("council")
            assert meta.metadata["councils_file_version"].value == "two-engines-1"
        dev, qa = counts
        assert dev["coder"] >= 2 and dev["tester"] == 0  # DEV's proposals (and judge turns) on coder
        assert qa["tester"] >= 2 and qa["coder"] == dev["coder"]  # QA's on tester only
    finally:
        for service, _ in servers.values():
            service.stop()
