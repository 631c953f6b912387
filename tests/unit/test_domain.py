"""The pure domain: validation, councils, prompts and the deliberation algorithm (scripted engine double)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleet_pipelines.domain import prompts
from fleet_pipelines.domain.councils import CouncilSettings, build_council
from fleet_pipelines.domain.deliberation import current_versions, proposal_requests, review_rounds
from fleet_pipelines.domain.models import Constraints, Message, Role, Task, TurnKind, TurnStatus
from tests.scripted import ScriptedEngine

SETTINGS = CouncilSettings(temperature=0.7, max_tokens=64)


def make_task(**overrides) -> Task:
    fields = {
        "task_id": "t-1",
        "description": "Build a cache.",
        "role": Role.DEV,
        "num_agents": 3,
        "rounds": 1,
    }
    return Task(**{**fields, **overrides})


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"task_id": "has space"}, "task_id"),
        ({"task_id": "x" * 129}, "task_id"),
        ({"role": "CHEF"}, "role"),
        ({"num_agents": 0}, "num_agents"),
        ({"num_agents": 11}, "num_agents"),
        ({"rounds": 4}, "rounds"),
        ({"description": ""}, "description"),
        ({"description": "x" * 8_001}, "description"),
        ({"constraints": {"requirements": ["r"] * 33}}, "requirements"),
        ({"constraints": {"timeout_seconds": 0}}, "timeout_seconds"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_task_validation_names_the_field(overrides, field):
    with pytest.raises(ValidationError) as exc:
        make_task(**overrides)
    assert field in str(exc.value)


def test_task_accepts_the_partition_key_alphabet():
    assert make_task(task_id="plan-1:DEV.v2_x").task_id == "plan-1:DEV.v2_x"


def test_council_ids_and_diversity():
    council = build_council(Role.QA, 3, SETTINGS)
    assert [a.agent_id for a in council] == ["agent-qa-001", "agent-qa-002", "agent-qa-003"]
    assert [a.diversity for a in council] == [False, True, True]
    assert council[0].temperature == 0.7
    assert council[1].temperature == pytest.approx(0.91)


def test_diversity_temperature_is_capped():
    council = build_council(Role.DEV, 2, CouncilSettings(temperature=1.9))
    assert council[1].temperature == 2.0


def test_prompts_carry_role_rubric_requirements_and_context():
    task = make_task(
        constraints=Constraints(
            rubric="fast", requirements=["LRU eviction", "thread safe"], metadata={"lang": "go"}
        )
    )
    baseline, diverse = build_council(Role.DEV, 2, SETTINGS)
    system, user = prompts.proposal_messages(task, baseline)
    assert system.content.startswith(prompts.ROLE_EXPERTISE[Role.DEV])
    assert "Evaluation rubric: fast" in system.content
    assert "- LRU eviction" in system.content and "- thread safe" in system.content
    assert prompts.DIVERSITY_INSTRUCTION not in system.content
    assert prompts.DIVERSITY_INSTRUCTION in prompts.proposal_messages(task, diverse)[0].content
    assert user.content.startswith("Task: Build a cache.")
    assert "Additional context:\nlang: go" in user.content
    for section in prompts.PROPOSAL_SECTIONS:
        assert section in user.content


def test_rounds_critique_every_peer_and_revise_own_proposal():
    task = make_task(rounds=2)
    council = build_council(task.role, 3, SETTINGS)
    engine = ScriptedEngine()
    proposals = engine(proposal_requests(task, council, SETTINGS))
    history = review_rounds(task, council, SETTINGS, proposals, engine)

    critiques = [h for h in history if h.kind is TurnKind.CRITIQUE]
    revisions = [h for h in history if h.kind is TurnKind.REVISE]
    assert len(critiques) == 2 * 6 and len(revisions) == 2 * 3
    assert all(c.agent_id != c.target_agent_id for c in critiques)
    # A revision in round 2 starts from the author's own round-1 revision and the critiques of it.
    round2 = next(b for b in engine.batches if b and b[0].kind is TurnKind.REVISE and b[0].round == 2)
    prompt = "\n".join(m.content for m in round2[0].messages)
    assert "revise by agent-dev-001 round 1" in prompt
    assert "critique by agent-dev-002 round 2 on agent-dev-001" in prompt
    assert "on agent-dev-002" not in prompt
    # All versions are kept; the current one is the latest round.
    finals = current_versions([*proposals, *history])
    assert {a: r.round for a, r in finals.items()} == {a.agent_id: 2 for a in council}
    assert len([*proposals, *history]) == 3 + 2 * 9


def test_failed_proposal_drops_out_and_failed_revision_keeps_previous_version():
    task = make_task(rounds=1)
    council = build_council(task.role, 3, SETTINGS)
    engine = ScriptedEngine(fail={("agent-dev-003", TurnKind.PROPOSE), ("agent-dev-002", TurnKind.REVISE)})
    proposals = engine(proposal_requests(task, council, SETTINGS))
    history = review_rounds(task, council, SETTINGS, proposals, engine)
    assert all("agent-dev-003" not in (h.agent_id, h.target_agent_id) for h in history)
    finals = current_versions([*proposals, *history])
    assert set(finals) == {"agent-dev-001", "agent-dev-002"}
    assert finals["agent-dev-001"].kind is TurnKind.REVISE
    assert finals["agent-dev-002"].kind is TurnKind.PROPOSE


def test_single_agent_or_zero_rounds_skip_review():
    engine = ScriptedEngine()
    solo = make_task(num_agents=1, rounds=3)
    council = build_council(solo.role, 1, SETTINGS)
    assert (
        review_rounds(solo, council, SETTINGS, engine(proposal_requests(solo, council, SETTINGS)), engine)
        == []
    )
    none = make_task(rounds=0)
    council = build_council(none.role, 3, SETTINGS)
    assert (
        review_rounds(none, council, SETTINGS, engine(proposal_requests(none, council, SETTINGS)), engine)
        == []
    )


def test_timeout_stops_further_rounds():
    task = make_task(rounds=3)
    council = build_council(task.role, 3, SETTINGS)
    engine = ScriptedEngine(timeout_kind=TurnKind.CRITIQUE)
    proposals = engine(proposal_requests(task, council, SETTINGS))
    history = review_rounds(task, council, SETTINGS, proposals, engine)
    assert {h.round for h in history} == {1}
    assert all(h.status is TurnStatus.TIMEOUT for h in history)


def test_authors_see_their_own_check_results_before_revising():
    """The checker seam: what it returns for an author's current version reaches that author's
    revision prompt; critiques are unchanged; no feedback for a role that does not write code."""
    from fleet_pipelines.domain.scoring import CheckResult

    checked: list[str] = []

    def check_code(task, text):
        checked.append(text)
        failing = "agent-dev-002" in text
        return [
            CheckResult(
                name="tests",
                value=0.5 if failing else 1.0,
                evidence="1/2 tests passed" if failing else "2/2 tests passed",
                ran="sandbox",
                output="FAIL test_negative: assert add(-1, -1) == -2" if failing else "all passed",
            ),
            CheckResult(name="lint", value=None, evidence="no Python code to lint"),
        ]

    task = Task(task_id="fb", description="add two numbers", role=Role.DEV, num_agents=2, rounds=1)
    council = build_council(task.role, 2, SETTINGS)
    engine = ScriptedEngine()
    proposals = engine(proposal_requests(task, council, SETTINGS))
    review_rounds(task, council, SETTINGS, proposals, engine, check_code)
    revisions = {r.agent_id: r.messages[-1].content for r in engine.batches[-1]}
    assert len(checked) == 2
    assert "FAIL test_negative: assert add(-1, -1) == -2" in revisions["agent-dev-002"]
    assert "- tests: FAILED: 1/2 tests passed" in revisions["agent-dev-002"]
    assert "- tests: ok: 2/2 tests passed" in revisions["agent-dev-001"]
    assert "FAIL" not in revisions["agent-dev-001"] and "lint" not in revisions["agent-dev-001"]
    assert all("checks ran" not in r.messages[-1].content for r in engine.batches[1])  # critiques

    architect = task.model_copy(update={"role": Role.ARCHITECT})
    engine, checked[:] = ScriptedEngine(), []
    review_rounds(
        architect,
        council,
        SETTINGS,
        engine(proposal_requests(architect, council, SETTINGS)),
        engine,
        check_code,
    )
    assert checked == [] and "checks ran" not in engine.batches[-1][0].messages[-1].content
    forced = CouncilSettings(execution_feedback=True)
    review_rounds(
        architect, council, forced, engine(proposal_requests(architect, council, forced)), engine, check_code
    )
    assert len(checked) == 2


def test_reviews_of_a_proposal_continue_its_conversation():
    """Every critique and the revision of a proposal start with the messages the author's proposal
    was written from and the proposal itself, token for token: the prefix an engine's prompt cache
    holds once (llama.cpp in the slot that wrote it, vLLM in its prefix cache)."""
    task = make_task(rounds=1)
    council = build_council(task.role, 3, SETTINGS)
    engine = ScriptedEngine()
    proposals = engine(proposal_requests(task, council, SETTINGS))
    history = review_rounds(task, council, SETTINGS, proposals, engine)
    requests = [r for batch in engine.batches for r in batch]
    for proposal_request, proposal in zip(requests[:3], proposals, strict=True):
        written = [*proposal_request.messages, Message(role="assistant", content=proposal.content)]
        reviews = [r for r in requests[3:] if (r.target_agent_id or r.agent_id) == proposal.agent_id]
        assert {r.kind for r in reviews} == {TurnKind.CRITIQUE, TurnKind.REVISE} and len(reviews) == 3
        assert all(r.messages[: len(written)] == written for r in reviews)
        assert all(r.conversation == (task.task_id, proposal.agent_id) for r in [proposal_request, *reviews])
    assert len(history) == 9
