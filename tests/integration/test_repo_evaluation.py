"""The repository suite in the evaluation: generated repositories with a real bug, candidates
judged by their patches in the sandbox (visible tests for the selector, hidden tests the verdict),
and the suite in the nightly run's sample."""

from __future__ import annotations

import pytest

from fleet_pipelines.domain.models import Role, TurnKind, TurnResult, TurnStatus
from fleet_pipelines.domain.scoring import ScoringWeights
from fleet_pipelines.evaluation import arms as ev
from fleet_pipelines.evaluation.repo_problems import RepoJudge, problem_workspace, repo_task
from fleet_pipelines.evaluation.repo_suite import REPO_CASES
from fleet_pipelines.evaluation.suites import get_suite, load_repos, sample_problems
from fleet_pipelines.sandbox import isolation_available
from fleet_pipelines.workspace.runs import RepoRunLimits, baseline, score_patch

needs_sandbox = pytest.mark.skipif(not isolation_available()[0], reason="needs the bubblewrap sandbox")


def reply(agent: str, text: str) -> TurnResult:
    return TurnResult(
        task_id="t",
        agent_id=agent,
        role=Role.DEV,
        kind=TurnKind.PROPOSE,
        round=0,
        status=TurnStatus.COMPLETED,
        content=text,
    )


@needs_sandbox
@pytest.mark.parametrize("case", REPO_CASES, ids=[c.name for c in REPO_CASES])
def test_every_generated_repository_has_a_real_bug_its_fix_and_hidden_tests(case):
    problem = next(p for p in load_repos() if p.repo_case == case.name)
    with problem_workspace(problem, RepoRunLimits()) as workspace:
        before = baseline(workspace)
        assert (
            before.status == "failed" and before.failed == 1 and before.passed >= 1
        )  # a failing visible test
        fixed = score_patch(workspace, case.fix, case.hidden_tests)
        assert fixed.applies and fixed.tests.status == "passed" and fixed.hidden.status == "passed"
        assert fixed.hidden.passed >= 1
        unfixed = score_patch(workspace, "", case.hidden_tests)  # no change proposed: scored as the base
        assert unfixed.applies and unfixed.changed_files == [] and unfixed.hidden.status == "failed"
        assert unfixed.tests.failed == 0 and unfixed.tests.not_counted >= 1  # the base's failure: not counted


@needs_sandbox
def test_the_judge_reads_patches_and_the_selector_never_sees_hidden_results():
    problem = load_repos()[0]
    case = REPO_CASES[0]
    with problem_workspace(problem, RepoRunLimits()) as workspace:
        task = repo_task(problem, workspace, num_agents=3, rounds=1, timeout_s=60)
        assert "def add(a, b)" in task.workspace_view and "test_add" in task.workspace_view
        assert "test_add_negative" not in task.workspace_view  # hidden tests stay hidden
        judge = RepoJudge(problem, task, workspace, RepoRunLimits(), ScoringWeights())
        turns = [
            reply("a1", "no diff here"),
            reply("a2", "```diff\n--- a/calc.py\n+++ b/calc.py\n@@ -9 +9 @@\n-nope\n+x\n```"),
            reply("a3", f"Fix the sign.\n\n```diff\n{case.fix}```"),
        ]
        outcome = judge.outcome(ev.Arm.COUNCIL, turns, turns, 1.0)
    statuses = [c.hidden_status for c in outcome.candidates]
    assert statuses == ["no_code", "no_apply", "passed"]
    assert outcome.selected == 2 and outcome.candidates[2].examples_passed == 2


def test_the_nightly_suite_can_join_the_repositories():
    suite = get_suite("humaneval,repos")
    problems = sample_problems(suite, "test", 2, seed=0)
    assert [p.suite for p in problems].count("repos") == 2 and [p.suite for p in problems].count(
        "humaneval"
    ) == 2
    assert suite.split_of(problems[-1]) == "test"
    with pytest.raises(ValueError, match="unknown suite"):
        get_suite("humaneval,nope")


@pytest.mark.heavy(55)
@needs_sandbox
def test_a_tiny_repository_evaluation_runs_every_arm(stack_env, dagster_instance):
    """The evaluation asset on the repository suite with the real engine (SmolLM2-135M): every
    arm runs and reports, whatever the model writes.

    Each arm once, at the least work that runs it: the smallest council and round (N=2, R=1), one
    sample for arm B, and 16 completion tokens (the config's least). At 16 tokens the model's JSON
    answers are cut off: each turn is told the error and answers again until the same error comes
    back (2-3 engine calls), and no candidate holds a patch (patches judged in the sandbox:
    `test_the_judge_reads_patches_and_the_selector_never_sees_hidden_results`). At 64 tokens the
    answers were cut at varying points, turns ran up to 7 engine calls, and this test took over
    twice as long."""
    import dagster as dg

    from fleet_pipelines.assets.evaluation import evaluation

    config = {
        "suite": "repos",
        "problem_ids": ["repos/calc-add"],
        "num_agents": 2,
        "rounds": 1,
        "max_tokens": 16,
        "max_samples_b": 1,
        "max_concurrent_problems": 1,
        "bootstrap_resamples": 200,
    }
    result = dg.materialize(
        [evaluation],
        resources=stack_env,
        instance=dagster_instance,
        partition_key="2026-01-03",
        run_config={"ops": {"evaluation": {"config": config}}},
    )
    assert result.success
    df = result.output_for_node("evaluation")
    assert sorted(df["arm"]) == sorted(a.value for a in ev.Arm)
    assert set(df["problem_id"]) == {"repos/calc-add"}
