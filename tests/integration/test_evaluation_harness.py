"""A check of the harness itself, in the real sandbox: every reference solution passes its hidden
test, every empty body fails it, and the prompt examples hold for the reference solutions where
the prompt's examples are written as evaluable Python. Over every problem too: an entry point
named like a builtin is the candidate's (the reference renamed `max` passes, an empty `max`
fails), and redefining the prompt's helpers (`poly`, `encode_cyclic`) gains a candidate nothing."""

from __future__ import annotations

import ast
import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from filelock import FileLock

from fleet_pipelines.evaluation import arms as ev
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
    return ev.examples_passed(run_tests(source, [], ev.examples_tests(problem, examples)).outcomes)


BUILTIN_NAMES = ("max", "sorted", "sum", "pow", "round", "min", "divmod", "format", "hash", "vars")


def named_like_a_builtin(problem: ev.Problem) -> ev.Problem:
    """The problem with its entry point renamed to a builtin that none of its texts uses."""
    texts = problem.prompt + problem.canonical_solution + problem.test
    name = next(n for n in BUILTIN_NAMES if not re.search(rf"\b{n}\b", texts))

    def rename(text: str) -> str:
        return re.sub(rf"\b{re.escape(problem.entry_point)}\b", name, text)

    return problem.model_copy(
        update={
            "entry_point": name,
            "prompt": rename(problem.prompt),
            "canonical_solution": rename(problem.canonical_solution),
            "test": rename(problem.test),
        }
    )


def helpers(problem: ev.Problem) -> list[str]:
    """The functions the prompt defines besides the entry point."""
    return [
        node.name
        for node in ast.parse(problem.prompt).body
        if isinstance(node, ast.FunctionDef) and node.name != problem.entry_point
    ]


def returning(name: str, value: str) -> str:
    return f"\n\ndef {name}(*args, **kwargs):\n    return {value}\n"


def helper_forgeries(problem: ev.Problem) -> tuple[str, list[str]]:
    """An honest wrong candidate (the entry point returns its first argument) and the same
    candidate with every helper of the prompt redefined (to return its first argument, or 0):
    what passes HumanEval/32, /38 and /50 where the helpers come from the candidate."""
    honest = ev.empty_source(problem) + returning(problem.entry_point, "args[0] if args else None")
    forged = [
        honest + "".join(returning(h, value) for h in helpers(problem))
        for value in ("args[0] if args else None", "0")
    ]
    return honest, forged


@pytest.fixture(scope="session")
def verdicts(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, list]:
    """Every problem judged once (~1,200 sandbox runs, about a minute) for the whole session: under
    xdist the first worker to ask judges and writes the verdicts, the others wait on the lock and
    read them (pytest-xdist's documented way to run a session fixture once)."""
    if worker_id == "master":
        return judge_all()
    shared = tmp_path_factory.getbasetemp().parent / "harness-verdicts.json"
    with FileLock(f"{shared}.lock"):
        if not shared.exists():
            shared.write_text(json.dumps(judge_all()))
        return json.loads(shared.read_text())


def judge_all() -> dict[str, list]:
    """Each problem's verdicts as JSON values (lists where tuples were), so a worker that reads them
    from disk sees what the one that computed them saw."""
    ok, why = isolation_available()
    if not ok:
        pytest.fail(f"the sandbox cannot isolate here, so hidden tests cannot run: {why}")

    def judge(problem: ev.Problem) -> tuple:
        renamed = named_like_a_builtin(problem)
        honest, forged = helper_forgeries(problem) if helpers(problem) else ("", [])
        return (
            hidden(problem, ev.reference_source(problem)),
            hidden(problem, ev.empty_source(problem)),
            len(ev.parse_examples(problem)),
            examples_held(problem, ev.reference_source(problem)),
            (renamed.entry_point, hidden(renamed, ev.reference_source(renamed))),
            hidden(renamed, ev.empty_source(renamed)),
            (hidden(problem, honest), [hidden(problem, f) for f in forged]) if forged else None,
        )

    # Sandbox runs are separate processes in their own temp dirs: parallel-safe.
    with ThreadPoolExecutor(max_workers=4) as pool:
        judged = dict(zip((p.problem_id for p in PROBLEMS), pool.map(judge, PROBLEMS), strict=True))
    return json.loads(json.dumps(judged))


@pytest.mark.heavy(45)
def test_every_reference_solution_passes_its_hidden_test(verdicts):
    failing = {pid: v[0] for pid, v in verdicts.items() if v[0] != "passed"}
    assert len(verdicts) == 164 + len(load_fleet())
    assert failing == {}


def test_every_empty_body_fails_its_hidden_test(verdicts):
    assert {pid: v[1] for pid, v in verdicts.items() if v[1] != "failed"} == {}


def test_an_entry_point_named_like_a_builtin_is_the_candidates_in_every_problem(verdicts):
    """Each problem's entry point renamed to a builtin (`max`, `sorted`, ...): the reference
    passes, so the hidden test called it and not the builtin; an empty body still fails."""
    assert {pid: v[4] for pid, v in verdicts.items() if v[4][1] != "passed"} == {}
    assert {pid: v[5] for pid, v in verdicts.items() if v[5] != "failed"} == {}


def test_redefining_the_prompts_helpers_gains_a_candidate_nothing(verdicts):
    """Every prompt's helper functions (HumanEval/10, /32, /38, /50, fleet/7) redefined by the
    candidate: the hidden test calls the prompt's, so the verdict is the honest wrong one's."""
    forged = {pid: v[6] for pid, v in verdicts.items() if v[6] is not None}
    assert {"HumanEval/32", "HumanEval/38", "HumanEval/50"} <= forged.keys()
    assert {pid: v for pid, v in forged.items() if v[0] != "failed" or set(v[1]) != {"failed"}} == {}


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
