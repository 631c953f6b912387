"""What agents know, against the real local engine (llama.cpp, SmolLM2-135M) on a real Ray head:
their own code's check results when they revise."""

from __future__ import annotations

import time

import pytest

from fleet_pipelines.dispatch.ray_dispatch import DispatchSettings, RayTurnDispatcher
from fleet_pipelines.domain.council import CouncilSettings, build_council
from fleet_pipelines.domain.deliberation import review_rounds
from fleet_pipelines.domain.models import Role, Task, TurnKind, TurnRequest, TurnResult, TurnStatus
from fleet_pipelines.llm.engine import EngineSettings
from fleet_pipelines.llm.local_server import MODEL_NAME
from fleet_pipelines.scoring.checks import execution_checks
from fleet_pipelines.scoring.sandbox import SandboxLimits

pytestmark = pytest.mark.integration

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
        TurnResult(
            task_id=task.task_id,
            agent_id=agent.agent_id,
            role=task.role,
            kind=TurnKind.PROPOSE,
            round=0,
            status=TurnStatus.COMPLETED,
            content=WRONG_ADD,
        )
        for agent in council
    ]
    engine = RayTurnDispatcher(
        EngineSettings(base_url=llm_server, model=MODEL_NAME), DispatchSettings(), deadline=time.time() + 240
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
