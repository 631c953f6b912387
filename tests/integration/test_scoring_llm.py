"""A full deliberation against the real llama.cpp server, Ray head and Dagster instance:
scores differ between proposals and every check carries its evidence; asset checks run."""

from __future__ import annotations

import dagster as dg

from fleet_pipelines.assets.deliberation import materialize_deliberation
from fleet_pipelines.domain.models import DeliberationStatus

TASK_CONFIG = {
    "description": "Write a Python function add(a, b) that returns the sum of two numbers.",
    "role": "DEV",
    "num_agents": 3,
    "rounds": 0,
    "rubric": "Correct and readable.",
    "requirements": ["return the sum", "accept two numbers"],
    "tests": "def test_add():\n    assert add(2, 3) == 5\n",
    "examples": [{"call": "add(-1, 1)", "expected": "0"}],
}


def test_scores_are_read_off_the_proposals_with_evidence(stack_env, dagster_instance):
    task_id = "scoring-llm-1"
    result = materialize_deliberation(dagster_instance, stack_env, task_id, TASK_CONFIG)
    assert result.success
    scores = result.output_for_node("scores")
    assert len(scores) == 3
    assert len({s.score for s in scores}) > 1, [(s.agent_id, s.score) for s in scores]
    for score in scores:
        checks = {c.name: c.model_dump() for c in score.checks}
        assert set(checks) >= {"code_parses", "lint", "tests", "requirement_coverage", "judge"}
        assert all(c["evidence"] for c in checks.values())
        assert checks["tests"]["ran"].startswith("sandbox") or checks["tests"]["value"] == 0.0
        judge = checks["judge"]
        # Schema-constrained: a verdict, or a reply recorded as unparseable, never an invented score.
        assert judge["value"] is not None or judge["evidence"].startswith("not scored")

    meta = dagster_instance.get_latest_materialization_event(
        dg.AssetKey("scores")
    ).asset_materialization.metadata
    assert {"scores", "winner_proposal", "evidence", "critiques_received"} <= set(meta)
    columns = {c.name for c in meta["scores"].value.schema.columns}
    assert {"rank", "agent_id", "score", "check_tests", "check_judge", "check_lint"} <= columns

    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["quorum_met"].passed
    assert "winner_passes_checks" in evaluations
    decision = result.output_for_node("decision")
    best = max(scores, key=lambda s: s.score)
    assert decision.status is DeliberationStatus.COMPLETED and decision.ranking[0].score == best.score
