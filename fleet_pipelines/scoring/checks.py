"""The checks that need a process or the engine: ruff lint, whether the code runs, the task's
tests in the sandbox, and the LLM judge. Each returns a `CheckResult` with what was run, an output
excerpt and the reason; `score_finals` adds them to the pure checks of `domain.scoring` and weighs
them all. `execution_checks` is the deliberation's `CodeChecker`: the same checks on an author's
current proposal, for its revision prompt.
"""

from __future__ import annotations

import ast
import builtins
import json
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..domain.deliberation import CodeChecker, TurnRunner
from ..domain.limits import SandboxLimits
from ..domain.models import AgentSpec, Task, TurnKind, TurnRequest, TurnResult
from ..domain.scoring import (
    JUDGE_SCHEMA,
    CheckResult,
    ProposalScore,
    ScoringWeights,
    extract_code_blocks,
    judge_messages,
    parse_judge_reply,
    python_source,
    score_proposal,
)
from ..sandbox import run_tests

LINT_PENALTY_PER_ISSUE = 0.2
RUFF_RULES = "E4,E7,E9,F"  # ruff's defaults: syntax, undefined names, unused imports, ...
# Findings that mean the code cannot run as written: undefined names (in a body they fail only
# when called, which nothing may do), a name redefined over its first definition, syntax errors.
NOT_RUNNABLE_RULES = ("F821", "F822", "F823", "F811", "E9")
JUDGE_AGENT_ID = "judge"
_EXCERPT = 1_500
_BUILTINS = frozenset(vars(builtins))


def ruff_binary() -> str | None:
    beside = Path(sys.executable).with_name("ruff")
    return str(beside) if beside.exists() else shutil.which("ruff")


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


def _finding(issue: dict) -> str:
    return f"line {issue['location']['row']}: {issue.get('code') or 'syntax'} {issue['message']}"


def lint_check(code: str, issues: list[dict] | None, ran: str) -> CheckResult:
    """ruff (`ruff_issues`) on the extracted Python with its default rules and no project config:
    1 - 0.2 per issue."""
    if not code.strip():
        return CheckResult(name="lint", value=None, evidence="no Python code to lint")
    if issues is None:
        return CheckResult(name="lint", value=None, evidence=ran)
    lines = [_finding(i) for i in issues if i.get("location")]
    return CheckResult(
        name="lint",
        value=round(max(0.0, 1.0 - LINT_PENALTY_PER_ISSUE * len(issues)), 4),
        evidence=f"{len(issues)} ruff issue(s)",
        ran=ran,
        output="\n".join(lines)[:_EXCERPT],
    )


def runs_check(code: str, issues: list[dict] | None, limits: SandboxLimits) -> CheckResult:
    """Whether the code can run at all: no undefined name, redefinition or syntax error among the
    ruff findings, and `import solution` succeeds in the sandbox (nothing is called)."""
    if not code.strip():
        return CheckResult(name="runs", value=None, evidence="no Python code to run")
    blocking = [
        _finding(i)
        for i in issues or []
        if i.get("location") and (i.get("code") or "E9").startswith(NOT_RUNNABLE_RULES)
    ]
    if blocking:
        return CheckResult(
            name="runs",
            value=0.0,
            evidence=f"not runnable: {len(blocking)} undefined name(s), redefinition(s) or syntax error(s)",
            ran=f"ruff check --select {','.join(NOT_RUNNABLE_RULES)}",
            output="\n".join(blocking)[:_EXCERPT],
        )
    run = run_tests(code, [], "", limits)
    result = run.result
    ran = f"sandbox: import solution ({result.status}, {result.duration_s:.2f} s)"
    if result.status in ("not_run", "error"):
        return CheckResult(
            name="runs", value=None, evidence=f"not_run: {result.reason}", ran=ran, not_run=True
        )
    failed = [o for o in run.outcomes or [] if not o["passed"]]
    if failed or not run.complete:
        detail = failed[0]["detail"] if failed else f"{result.status}: {result.reason}"
        return CheckResult(
            name="runs",
            value=0.0,
            evidence="not runnable: importing the module failed",
            ran=ran,
            output=detail[-_EXCERPT:],
        )
    return CheckResult(name="runs", value=1.0, evidence="imports cleanly; no undefined names", ran=ran)


def example_entry_points(examples: Sequence[tuple[str, str]]) -> list[str]:
    """The names the examples mean the solution's by, even where a builtin has that name: an
    example that calls no other name than builtins (`sorted([3, 1])`, `round(2.5)`) is about a
    function of the task named like a builtin, the one it calls outermost. In `round(f(x), 2)`
    `f` is the task's and `round` the builtin. (Tests say it themselves: `from solution import
    sorted`.)"""
    names: dict[str, None] = {}
    for call, _ in examples:
        try:
            tree = ast.parse(call, mode="eval").body
        except SyntaxError:
            continue
        called = {
            n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and called <= _BUILTINS:
            names[tree.func.id] = None
    return list(names)


def tests_check(task: Task, code: str, limits: SandboxLimits) -> CheckResult:
    """The task's tests and examples against the proposal's code (`solution.py`), run by the
    sandbox's harness: the solution in its own process, outcomes on a channel it cannot reach."""
    constraints = task.constraints
    if not constraints.tests.strip() and not constraints.examples:
        return CheckResult(name="tests", value=None, evidence="the task carries no tests")
    if not code.strip():
        return CheckResult(name="tests", value=0.0, evidence="no Python code that parses to test")
    examples = [(e.call, e.expected) for e in constraints.examples]
    run = run_tests(code, examples, constraints.tests, limits, example_entry_points(examples))
    result = run.result
    ran = (
        f"sandbox: {len(examples)} example(s) + task tests against solution.py "
        f"({result.status}, {result.duration_s:.2f} s)"
    )
    if result.status in ("not_run", "error"):  # "error": the host saw the sandbox's setup fail
        return CheckResult(
            name="tests",
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
            name="tests",
            value=0.0,
            evidence=f"{result.status}: {result.reason}; tests unfinished ({reported} reported); {isolation}",
            ran=ran,
            output=(result.stdout[-700:] + "\n" + result.stderr[-700:]).strip(),
        )
    passed = sum(o["passed"] for o in run.outcomes)
    failures = "\n".join(f"FAIL {o['name']}: {o['detail']}" for o in run.outcomes if not o["passed"])
    return CheckResult(
        name="tests",
        value=round(passed / len(run.outcomes), 4),
        evidence=f"{passed}/{len(run.outcomes)} tests passed; {isolation}",
        ran=ran,
        output=(failures or "all passed")[:_EXCERPT],
    )


def judge_requests(task: Task, finals: Mapping[str, TurnResult], max_tokens: int) -> list[TurnRequest]:
    """One judge turn per final proposal, greedy, constrained to JUDGE_SCHEMA where the engine can."""
    return [
        TurnRequest(
            task_id=task.task_id,
            agent_id=JUDGE_AGENT_ID,
            role=task.role,
            kind=TurnKind.JUDGE,
            round=final.round,
            messages=judge_messages(task, final.content),
            temperature=0.0,
            max_tokens=max_tokens,
            target_agent_id=agent_id,
            response_schema=JUDGE_SCHEMA,
        )
        for agent_id, final in finals.items()
    ]


def judge_check(result: TurnResult | None) -> CheckResult:
    """The judge's verdict as a check; a failed turn or an unparseable reply is recorded, not scored."""
    ran = "LLM judge against the rubric (JSON schema response)"
    if result is None or not result.ok:
        why = "no judge turn" if result is None else f"judge turn {result.status.value}: {result.error}"
        return CheckResult(name="judge", value=None, evidence=f"not scored: {why}", ran=ran)
    verdict = parse_judge_reply(result.content)
    if verdict is None:
        return CheckResult(
            name="judge",
            value=None,
            evidence="not scored: judge reply unparseable",
            ran=ran,
            output=result.content[:500],
        )
    return CheckResult(
        name="judge",
        value=round(verdict.score / 10, 4),
        evidence=f"judge {verdict.score:g}/10: {verdict.rationale}",
        ran=ran,
        output=result.content[:500],
    )


def score_finals(
    task: Task,
    council: Sequence[AgentSpec],
    finals: Mapping[str, TurnResult],
    weights: ScoringWeights,
    limits: SandboxLimits,
    run_turns: TurnRunner,
    judge_max_tokens: int,
    check_code: CodeChecker | None = None,
) -> list[ProposalScore]:
    """Every final proposal scored, in council order; judge turns go to the engine as one batch.
    `check_code`: the checks that run the proposal (default `execution_checks` under `limits`;
    a repository task's patch checks)."""
    ordered = {a.agent_id: finals[a.agent_id] for a in council if a.agent_id in finals}
    verdicts = {r.target_agent_id: r for r in run_turns(judge_requests(task, ordered, judge_max_tokens))}
    scored = []
    for agent_id, final in ordered.items():
        ran = check_code(task, final.content) if check_code else execution_checks(task, final.content, limits)
        tool_checks = [*ran, judge_check(verdicts.get(agent_id))]
        scored.append(score_proposal(task, final, weights, tool_checks))
    return scored


def execution_checks(task: Task, text: str, limits: SandboxLimits) -> list[CheckResult]:
    """The checks that run a proposal's code (from its text): lint, runs, tests."""
    code = python_source(extract_code_blocks(text))
    issues, ran = ruff_issues(code) if code.strip() else (None, "no Python code to lint")
    return [lint_check(code, issues, ran), runs_check(code, issues, limits), tests_check(task, code, limits)]
