"""A check of the harness itself, in the real sandbox: every reference solution passes its hidden
test, every empty body fails it, and the prompt examples hold for the reference solutions where
the prompt's examples are written as evaluable Python."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from fleet_pipelines.domain import evaluation as ev
from fleet_pipelines.evaluation.suites import load_fleet, load_humaneval
from fleet_pipelines.sandbox import isolation_available, run_tests

PROBLEMS = load_humaneval() + load_fleet()


def hidden(problem: ev.Problem, source: str) -> str:
    run = run_tests(source, [], ev.hidden_tests(problem))
    return ev.hidden_status(run.outcomes, run.complete, run.result.status)


def examples_held(problem: ev.Problem, source: str) -> int:
    examples = ev.parse_examples(problem)
    if not examples:
        return 0
    return ev.examples_passed(run_tests(source, [], ev.examples_tests(examples)).outcomes)


@pytest.fixture(scope="module")
def verdicts() -> dict[str, tuple[str, str, int, int]]:
    ok, why = isolation_available()
    if not ok:
        pytest.fail(f"the sandbox cannot isolate here, so hidden tests cannot run: {why}")

    def judge(problem: ev.Problem) -> tuple[str, str, int, int]:
        return (
            hidden(problem, ev.reference_source(problem)),
            hidden(problem, ev.empty_source(problem)),
            len(ev.parse_examples(problem)),
            examples_held(problem, ev.reference_source(problem)),
        )

    # Sandbox runs are separate processes in their own temp dirs: parallel-safe.
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip((p.problem_id for p in PROBLEMS), pool.map(judge, PROBLEMS), strict=True))


def test_every_reference_solution_passes_its_hidden_test(verdicts):
    failing = {pid: v[0] for pid, v in verdicts.items() if v[0] != "passed"}
    assert len(verdicts) == 164 + len(load_fleet())
    assert failing == {}


def test_every_empty_body_fails_its_hidden_test(verdicts):
    assert {pid: v[1] for pid, v in verdicts.items() if v[1] != "failed"} == {}


def test_prompt_examples_hold_for_reference_solutions(verdicts):
    with_examples = {pid: v for pid, v in verdicts.items() if v[2]}
    holding = [pid for pid, v in with_examples.items() if v[3] == v[2]]
    assert len(with_examples) >= 130  # 122 of 164 HumanEval prompts + every fleet task
    # The rest are prompts whose examples are wrong or not Python (e.g. "19 - 5 - 6 = 8").
    assert len(holding) >= 120
    assert all(verdicts[p.problem_id][3] == verdicts[p.problem_id][2] for p in load_fleet())


def test_a_chat_style_answer_is_judged_like_the_reference():
    problem = next(p for p in PROBLEMS if p.problem_id == "HumanEval/23")
    right = ev.candidate_source(problem, "```python\ndef strlen(string):\n    return len(string)\n```")
    wrong = ev.candidate_source(problem, "```python\ndef strlen(string):\n    return len(string) + 1\n```")
    main_block = (
        "```python\ndef strlen(s):\n    return len(s)\n\nif __name__ == '__main__':\n    exit(1)\n```"
    )
    assert hidden(problem, right) == "passed"
    assert hidden(problem, wrong) == "failed"
    # The candidate runs as a module, so its __main__ block does not decide the verdict.
    assert hidden(problem, ev.candidate_source(problem, main_block)) == "passed"
    assert examples_held(problem, wrong) == 0
    assert examples_held(problem, right) == len(ev.parse_examples(problem))


def test_a_candidate_that_exits_0_or_prints_a_verdict_does_not_pass():
    problem = next(p for p in PROBLEMS if p.problem_id == "HumanEval/23")
    for completion in (
        "```python\nimport os\nos._exit(0)\ndef strlen(string):\n    return 0\n```",
        "```python\ndef strlen(string):\n    print('@@fleet-examples@@ 9')\n    raise SystemExit(0)\n```",
    ):
        source = ev.candidate_source(problem, completion)
        assert hidden(problem, source) == "failed"
        assert examples_held(problem, source) == 0
