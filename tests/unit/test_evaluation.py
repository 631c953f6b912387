"""Metrics, statistics, the selector and program building of the evaluation, on constructed results."""

from __future__ import annotations

import pytest

from fleet_pipelines.evaluation import arms as ev
from fleet_pipelines.evaluation.suites import get_suite, load_humaneval, sample_problems


def cand(passed: bool, examples: int = 0, score: float = 0.0, has_code: bool = True) -> ev.Candidate:
    return ev.Candidate(
        agent_id="a",
        has_code=has_code,
        examples_passed=examples,
        examples_total=3,
        score=score,
        passed=passed,
    )


def outcome(pid: str, arm: ev.Arm, candidates: list[ev.Candidate], tokens: int = 100) -> ev.ArmOutcome:
    return ev.ArmOutcome(
        problem_id=pid,
        arm=arm,
        candidates=candidates,
        selected=ev.select(candidates),
        tokens_in=tokens,
        tokens_out=tokens // 2,
        calls=len(candidates),
        failed_calls=0,
        wall_s=2.0,
    )


def test_selector_prefers_examples_then_score_then_order_and_never_reads_hidden_verdict():
    assert ev.select([cand(True, 1), cand(False, 2)]) == 1  # examples outrank the hidden verdict
    assert ev.select([cand(False, 2, 0.1), cand(True, 2, 0.9)]) == 1  # score breaks example ties
    assert ev.select([cand(False, 2, 0.5), cand(True, 2, 0.5)]) == 0  # full tie: earliest
    assert ev.select([cand(True, 5, 1.0, has_code=False), cand(False)]) == 1  # no code: not selectable
    assert ev.select([cand(False, has_code=False)]) is None
    assert ev.select([]) is None


def test_all_fail_all_pass_and_ties_in_arm_summaries():
    all_fail = [outcome(f"p{i}", ev.Arm.COUNCIL, [cand(False), cand(False)]) for i in range(4)]
    s = ev.summarize_arm(ev.Arm.COUNCIL, all_fail)
    assert (s.pass_at_1, s.oracle, s.one_sample, s.solved) == (0.0, 0.0, 0.0, 0)
    assert s.selection_efficiency is None  # no headroom: undefined, not 0 or 1
    assert s.tokens_per_solved is None and s.wall_s_per_solved is None
    assert s.tokens_in_per_problem == 100 and s.tokens_out_per_problem == 50 and s.calls_per_problem == 2

    all_pass = [outcome(f"p{i}", ev.Arm.COUNCIL, [cand(True), cand(True)]) for i in range(4)]
    s = ev.summarize_arm(ev.Arm.COUNCIL, all_pass)
    assert (s.pass_at_1, s.oracle, s.one_sample, s.solved) == (1.0, 1.0, 1.0, 4)
    assert s.selection_efficiency is None
    assert s.tokens_per_solved == 150 and s.wall_s_per_solved == 2.0

    # Ties on the examples: the earliest candidate is taken, whatever the hidden test says.
    tied = [
        outcome("p0", ev.Arm.SAMPLED, [cand(False, 1), cand(True, 1)]),
        outcome("p1", ev.Arm.SAMPLED, [cand(True, 1), cand(False, 1)]),
    ]
    s = ev.summarize_arm(ev.Arm.SAMPLED, tied)
    assert (s.pass_at_1, s.oracle, s.one_sample) == (0.5, 1.0, 0.5)
    assert s.selection_efficiency == 0.0  # no better than a random pick

    # The selector finds the passing candidate the examples point at.
    helped = [outcome("p0", ev.Arm.SAMPLED, [cand(False, 0), cand(False, 1), cand(True, 3), cand(False, 0)])]
    s = ev.summarize_arm(ev.Arm.SAMPLED, helped)
    assert (s.pass_at_1, s.oracle, s.one_sample) == (1.0, 1.0, 0.25)
    assert s.selection_efficiency == 1.0

    with pytest.raises(ValueError, match="no outcomes"):
        ev.summarize_arm(ev.Arm.GREEDY, helped)


def test_selection_efficiency_formula():
    assert ev.selection_efficiency(0.5, 0.25, 0.75) == pytest.approx(0.5)
    assert ev.selection_efficiency(0.1, 0.2, 0.6) == pytest.approx(-0.25)  # worse than random
    assert ev.selection_efficiency(0.3, 0.3, 0.3) is None


def test_exact_mcnemar_matches_the_binomial_tail():
    assert ev.mcnemar_exact(0, 0) == 1.0
    assert ev.mcnemar_exact(3, 3) == 1.0
    assert ev.mcnemar_exact(5, 0) == pytest.approx(2 / 32)
    assert ev.mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert ev.mcnemar_exact(9, 1) == pytest.approx(2 * 11 / 1024)
    assert ev.mcnemar_exact(20, 0) < 1e-5


def test_paired_comparison_counts_discordant_pairs_and_bootstraps_over_problems():
    ties = [
        outcome(f"p{i}", arm, [cand(i % 2 == 0)])
        for i in range(10)
        for arm in (ev.Arm.COUNCIL, ev.Arm.SAMPLED)
    ]
    c = ev.paired_comparison(ev.Arm.COUNCIL, ev.Arm.SAMPLED, ties, resamples=2000)
    assert (c.both, c.only_first, c.only_second, c.neither) == (5, 0, 0, 5)
    assert c.difference == 0.0 and c.ci_low == 0.0 and c.ci_high == 0.0 and c.mcnemar_p == 1.0

    better = [outcome(f"p{i}", ev.Arm.COUNCIL, [cand(True)]) for i in range(12)]
    better += [outcome(f"p{i}", ev.Arm.PROPOSALS, [cand(i < 2)]) for i in range(12)]
    c = ev.paired_comparison(ev.Arm.COUNCIL, ev.Arm.PROPOSALS, better, resamples=2000, seed=1)
    assert (c.only_first, c.only_second, c.both) == (10, 0, 2)
    assert c.difference == pytest.approx(10 / 12)
    assert 0 < c.ci_low <= c.difference <= c.ci_high <= 1
    assert c.mcnemar_p == pytest.approx(2 / 1024)

    with pytest.raises(ValueError, match="no problem"):
        ev.paired_comparison(ev.Arm.COUNCIL, ev.Arm.GREEDY, better)


def test_budget_prefix_takes_the_sample_count_closest_to_the_budget():
    assert ev.budget_prefix([100, 100, 100, 100], 250) == 2  # 200 and 300 tie: fewer wins
    assert ev.budget_prefix([100, 100, 100, 100], 260) == 3
    assert ev.budget_prefix([100, 100], 10_000) == 2
    assert ev.budget_prefix([500], 0) == 1  # at least one sample
    assert ev.budget_prefix([], 100) == 0


def test_drops_flag_only_falls_beyond_tolerance():
    before = {ev.Arm.GREEDY: 0.2, ev.Arm.COUNCIL: 0.5}
    assert ev.drops(before, {ev.Arm.GREEDY: 0.2, ev.Arm.COUNCIL: 0.46}, 0.05) == []
    fallen = ev.drops(before, {ev.Arm.GREEDY: 0.25, ev.Arm.COUNCIL: 0.3}, 0.05)
    assert [(d.arm, d.previous, d.current) for d in fallen] == [(ev.Arm.COUNCIL, 0.5, 0.3)]


def test_examples_are_parsed_from_doctests_and_one_line_forms():
    problems = {p.problem_id: p for p in load_humaneval()}
    first = ev.parse_examples(problems["HumanEval/0"])
    assert first == [
        ev.Example(call="has_close_elements([1.0, 2.0, 3.0], 0.5)", expected="False"),
        ev.Example(call="has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)", expected="True"),
    ]
    arrows = ev.parse_examples(problems["HumanEval/155"])  # "even_odd_count(-12) ==> (1, 1)"
    assert ev.Example(call="even_odd_count(-12)", expected="(1, 1)") in arrows
    assert ev.parse_examples(problems["HumanEval/41"]) == []  # no worked example in that prompt


def test_candidate_source_reads_a_full_definition_or_a_body():
    problem = next(p for p in load_humaneval() if p.problem_id == "HumanEval/23")  # strlen
    full = "Here:\n```python\ndef strlen(string: str) -> int:\n    return len(string)\n```\nDone."
    source = ev.candidate_source(problem, full)
    assert source is not None and source.startswith(problem.prompt)
    assert source.rstrip().endswith("return len(string)")
    body = ev.candidate_source(problem, "```python\nreturn len(string)\n```")
    assert body == problem.prompt + "    return len(string)\n"
    assert ev.candidate_source(problem, "") is None
    assert ev.candidate_source(problem, "```bash\nls\n```") is None


def test_humaneval_adapter_reads_164_problems_and_splits_0_to_39_for_development():
    suite = get_suite("humaneval")
    problems = suite.load()
    assert len(problems) == 164 and problems[0].problem_id == "HumanEval/0"
    dev = sample_problems(suite, "dev", 0, seed=0)
    assert [p.index for p in dev] == list(range(40))
    test = sample_problems(suite, "test", 5, seed=3)
    assert len(test) == 5 and all(p.index >= 40 for p in test)
    assert test == sample_problems(suite, "test", 5, seed=3)  # same seed, same sample
    assert [p.problem_id for p in sample_problems(suite, "all", 0, 0, ["HumanEval/7"])] == ["HumanEval/7"]
    with pytest.raises(ValueError, match="unknown problems"):
        sample_problems(suite, "all", 0, 0, ["HumanEval/999"])
    with pytest.raises(ValueError, match="unknown suite"):
        get_suite("mbpp")


def test_fleet_suite_has_ten_tasks_for_other_roles_with_examples():
    problems = get_suite("fleet").load()
    assert len(problems) >= 10
    assert {p.role.value for p in problems} == {"DATA", "DEVOPS", "QA", "ARCHITECT"}
    assert all(ev.parse_examples(p) for p in problems)


def test_progress_names_each_problem_and_arm_with_passes_tokens_and_time_left():
    def outcome(problem: str, arm: ev.Arm, passed: bool) -> ev.ArmOutcome:
        candidate = ev.Candidate(agent_id="a", round=0, has_code=True, passed=passed, hidden_status="passed")
        return ev.ArmOutcome(
            problem_id=problem,
            arm=arm,
            candidates=[candidate],
            selected=0,
            tokens_in=100,
            tokens_out=20,
            calls=1,
            failed_calls=0,
            wall_s=3.0,
        )

    progress = ev.EvaluationProgress(problems=2, arms=len(ev.Arm), started=0.0)
    first = progress.problem_done(
        [outcome("HumanEval/2", arm, arm is ev.Arm.COUNCIL) for arm in ev.Arm], 600.0
    )
    assert len(first) == len(ev.Arm)
    assert first[0].startswith(
        "evaluation 1/10: HumanEval/2 arm A failed (120 tokens, 3 s); passes so far A 0/1"
    )
    assert (
        "D 1/1" in first[-1]
        and "600 tokens in all" in first[-1]
        and "~10 min left at the current pace" in first[-1]
    )
    second = progress.problem_done([outcome("HumanEval/23", arm, True) for arm in ev.Arm], 1200.0)
    assert second[-1].startswith("evaluation 10/10: HumanEval/23 arm E passed")
    assert "passes so far A 1/2 B 1/2 C 1/2 D 2/2 E 1/2" in second[-1] and second[-1].endswith(
        "all problems done"
    )


def test_the_evaluation_config_draws_its_problems_and_refuses_an_unknown_split():
    import dagster as dg

    from fleet_pipelines.evaluation.config import EvaluationConfig
    from fleet_pipelines.resources.council import CouncilResource

    suite, problems = EvaluationConfig(problem_ids=["HumanEval/23", "HumanEval/2"]).problems()
    assert suite.name == "humaneval" and [p.problem_id for p in problems] == ["HumanEval/23", "HumanEval/2"]
    _, sampled = EvaluationConfig(split="dev", sample_size=3, seed=1).problems()
    assert len(sampled) == 3 and all(int(p.problem_id.split("/")[1]) < 40 for p in sampled)
    with pytest.raises(dg.Failure, match="split must be dev, test or all, not 'tests'"):
        EvaluationConfig(split="tests").problems()
    council = CouncilResource()
    settings = EvaluationConfig(num_agents=4, max_tokens=64).run_settings(
        council.sandbox.to_model(), council.weights.to_model()
    )
    assert (settings.num_agents, settings.max_tokens, settings.rounds) == (4, 64, 1)
    assert settings.sandbox == council.sandbox.to_model()


def test_the_evaluation_config_is_derived_from_its_settings_bounds_included():
    """One declaration per field: the config's run settings are EvaluationSettings' fields with
    their defaults, bounds and descriptions, and a value out of bounds is refused by the config."""
    from pydantic import ValidationError

    from fleet_pipelines.evaluation.config import EvaluationConfig
    from fleet_pipelines.evaluation.settings import FROM_THE_COUNCIL, EvaluationSettings

    derived = EvaluationSettings.model_fields.keys() - set(FROM_THE_COUNCIL)
    assert derived == {
        "num_agents",
        "rounds",
        "temperature",
        "max_tokens",
        "max_samples_b",
        "problem_timeout_s",
    }
    for name in derived:
        config, settings = EvaluationConfig.model_fields[name], EvaluationSettings.model_fields[name]
        assert (config.default, config.description, config.metadata) == (
            settings.default,
            settings.description,
            settings.metadata,
        )
    for bad in (
        {"num_agents": 1},
        {"rounds": 4},
        {"temperature": 2.5},
        {"max_tokens": 8},
        {"problem_timeout_s": 0},
    ):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            EvaluationConfig(**bad)
