"""The code checks: ruff lint, whether the code runs, the task's tests in the sandbox. Each
returns a `CheckResult` with what was run, an output excerpt and the reason. `execution_checks`
is the deliberation's `CodeChecker` of a code task: these checks on a proposal's text, for its
score (`finals.score_finals`) and its author's revision prompt. Beside them, `patch.py` holds a
repository task's checks and `finals.py` the judge; each check is a line of `domain.scoring.CHECKS`.
"""

from __future__ import annotations

import ast
import builtins
import json
import subprocess
from collections.abc import Sequence

from ..domain.limits import SandboxLimits
from ..domain.models import Task
from ..domain.python_ast import parse_expression, parse_module
from ..domain.scoring import CheckResult, check_named, extract_code_blocks, python_source
from ..domain.workspace import excerpt
from ..linter import RUFF_RULES, ruff_binary
from ..sandbox import run_tests

LINT, RUNS, TESTS = (check_named(n) for n in ("lint", "runs", "tests"))
LINT_PENALTY_PER_ISSUE = 0.2
# Findings that mean the code cannot run as written: undefined names (in a body they fail only
# when called, which nothing may do), a name redefined over its first definition, syntax errors.
NOT_RUNNABLE_RULES = ("F821", "F822", "F823", "F811", "E9")
_EXCERPT = 1_500
_BUILTINS = frozenset(vars(builtins))


def ruff_issues(code: str) -> tuple[list[dict] | None, str]:
    """ruff's findings on the code (None when ruff could not run or its output is unreadable), and
    what was run or why not."""
    ruff = ruff_binary()
    if ruff is None:
        return None, "not run: ruff is not installed"
    argv = [ruff, "check", "--isolated", "--select", RUFF_RULES, "--output-format", "json"]
    argv += ["--stdin-filename", "solution.py", "-"]
    done = subprocess.run(argv, input=code, capture_output=True, text=True, timeout=60)
    try:
        return json.loads(done.stdout), f"ruff check --isolated --select {RUFF_RULES} solution.py"
    except json.JSONDecodeError:
        return None, f"ruff output unreadable: {done.stderr[-_EXCERPT:]}"


def lint_value(issues: int) -> float:
    """The lint check's value for `issues` ruff findings (a proposal's code, a patch's files)."""
    return round(max(0.0, 1.0 - LINT_PENALTY_PER_ISSUE * issues), 4)


def _finding(issue: dict) -> str:
    return f"line {issue['location']['row']}: {issue.get('code') or 'syntax'} {issue['message']}"


def lint_check(code: str, issues: list[dict] | None, ran: str) -> CheckResult:
    """ruff (`ruff_issues`) on the extracted Python with its default rules and no project config:
    1 - 0.2 per issue."""
    if not code.strip():
        return CheckResult(name=LINT, value=None, evidence="no Python code to lint")
    if issues is None:
        return CheckResult(name=LINT, value=None, evidence=ran)
    lines = [_finding(i) for i in issues if i.get("location")]
    return CheckResult(
        name=LINT,
        value=lint_value(len(issues)),
        evidence=f"{len(issues)} ruff issue(s)",
        ran=ran,
        output=excerpt("\n".join(lines), _EXCERPT),
    )


def runs_check(code: str, issues: list[dict] | None, limits: SandboxLimits) -> CheckResult:
    """Whether the code can run at all: no undefined name, redefinition or syntax error among the
    ruff findings, and `import solution` succeeds in the sandbox (nothing is called)."""
    if not code.strip():
        return CheckResult(name=RUNS, value=None, evidence="no Python code to run")
    blocking = [
        _finding(i)
        for i in issues or []
        if i.get("location") and (i.get("code") or "E9").startswith(NOT_RUNNABLE_RULES)
    ]
    if blocking:
        return CheckResult(
            name=RUNS,
            value=0.0,
            evidence=f"not runnable: {len(blocking)} undefined name(s), redefinition(s) or syntax error(s)",
            ran=f"ruff check --select {','.join(NOT_RUNNABLE_RULES)}",
            output=excerpt("\n".join(blocking), _EXCERPT),
        )
    run = run_tests(code, [], "", limits)
    result = run.result
    ran = f"sandbox: import solution ({result.status}, {result.duration_s:.2f} s)"
    if result.status in ("not_run", "error"):
        return CheckResult(name=RUNS, value=None, evidence=f"not_run: {result.reason}", ran=ran, not_run=True)
    failed = [o for o in run.outcomes or [] if not o["passed"]]
    if failed or not run.complete:
        detail = failed[0]["detail"] if failed else f"{result.status}: {result.reason}"
        return CheckResult(
            name=RUNS,
            value=0.0,
            evidence="not runnable: importing the module failed",
            ran=ran,
            output=detail[-_EXCERPT:],
        )
    return CheckResult(name=RUNS, value=1.0, evidence="imports cleanly; no undefined names", ran=ran)


def example_entry_points(examples: Sequence[tuple[str, str]]) -> list[str]:
    """The names the examples mean the solution's by, even where a builtin has that name: an
    example that calls no other name than builtins (`sorted([3, 1])`, `round(2.5)`) is about a
    function of the task named like a builtin, the one it calls outermost. In `round(f(x), 2)`
    `f` is the task's and `round` the builtin. (Tests say it themselves: `from solution import
    sorted`.)"""
    names: dict[str, None] = {}
    for call, _ in examples:
        try:
            tree = parse_expression(call).body
        except SyntaxError:
            continue
        called = {
            n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and called <= _BUILTINS:
            names[tree.func.id] = None
    return list(names)


def unstated_builtin_entry_points(code: str, tests: str) -> list[str]:
    """The solution's top-level functions named like a builtin that the tests call by that bare
    name without stating which they mean (`from solution import sorted`): with no example to
    tell (`example_entry_points`), the builtin or the solution's would be a guess."""
    try:
        solution, test_tree = parse_module(code), parse_module(tests)
    except SyntaxError:
        return []
    defined = {
        n.name
        for n in solution.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name in _BUILTINS
    }
    stated = {
        alias.asname or alias.name
        for n in ast.walk(test_tree)
        if isinstance(n, ast.ImportFrom) and n.module == "solution"
        for alias in n.names
    }
    used = {n.id for n in ast.walk(test_tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted((defined & used) - stated)


def tests_check(task: Task, code: str, limits: SandboxLimits) -> CheckResult:
    """The task's tests and examples against the proposal's code (`solution.py`), run by the
    sandbox's harness: the solution in its own process, outcomes on a channel it cannot reach."""
    constraints = task.constraints
    if not constraints.tests.strip() and not constraints.examples:
        return CheckResult(name=TESTS, value=None, evidence="the task carries no tests")
    if not code.strip():
        return CheckResult(name=TESTS, value=0.0, evidence="no Python code that parses to test")
    unstated = [] if constraints.examples else unstated_builtin_entry_points(code, constraints.tests)
    if unstated:
        names = ", ".join(unstated)
        return CheckResult(
            name=TESTS,
            value=None,
            evidence=f"not_run: the solution defines {names} like the builtin, and the task has no example "
            f"and its tests do not say `from solution import {unstated[0]}`: which one the tests mean is "
            "not guessed",
            not_run=True,
        )
    examples = [(e.call, e.expected) for e in constraints.examples]
    run = run_tests(code, examples, constraints.tests, limits, example_entry_points(examples))
    result = run.result
    ran = (
        f"sandbox: {len(examples)} example(s) + task tests against solution.py "
        f"({result.status}, {result.duration_s:.2f} s)"
    )
    if result.status in ("not_run", "error"):  # "error": the host saw the sandbox's setup fail
        return CheckResult(
            name=TESTS,
            value=None,
            evidence=f"not_run: {result.reason}",
            ran=ran,
            output=result.stderr[-500:],
            not_run=True,
        )
    isolation = f"isolation: {result.isolation}"
    if not run.outcomes or not run.complete:
        reported = len(run.outcomes or [])
        return CheckResult(
            name=TESTS,
            value=0.0,
            evidence=f"{result.status}: {result.reason}; tests unfinished ({reported} reported); {isolation}",
            ran=ran,
            output=(result.stdout[-700:] + "\n" + result.stderr[-700:]).strip(),
        )
    passed = sum(o["passed"] for o in run.outcomes)
    failed = [o for o in run.outcomes if not o["passed"]]
    # each failure named, its detail cut to its share (head and tail): no name is lost in the cut
    share = max(_EXCERPT // max(len(failed), 1) - 80, 120)
    failures = "\n".join(f"FAIL {o['name']}: {excerpt(o['detail'], share)}" for o in failed)
    return CheckResult(
        name=TESTS,
        value=round(passed / len(run.outcomes), 4),
        evidence=f"{passed}/{len(run.outcomes)} tests passed; {isolation}",
        ran=ran,
        output=excerpt(failures or "all passed", _EXCERPT),
    )


def execution_checks(task: Task, text: str, limits: SandboxLimits) -> list[CheckResult]:
    """The checks that run a proposal's code (from its text): lint, runs, tests."""
    code = python_source(extract_code_blocks(text))
    issues, ran = ruff_issues(code) if code.strip() else (None, "no Python code to lint")
    return [lint_check(code, issues, ran), runs_check(code, issues, limits), tests_check(task, code, limits)]
