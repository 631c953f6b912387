"""The patch checks: a repository task's proposal on its repository, run in a fresh sandboxed
copy (`workspace.runs.score_patch`): it applies, the repository's tests and the hidden tests pass
after it, it leaves alone what judges it, ruff on the changed Python files. Each a `CheckResult`
with its evidence (before and after, the first failure), weighed by `domain.scoring` like the
code checks beside them (`code.py`); each is a line of `domain.scoring.CHECKS`.
"""

from __future__ import annotations

from collections.abc import Callable

from ..domain.models import Task
from ..domain.scoring import CheckResult, check_named
from ..domain.workspace import FailToPass, PatchEvidence, TestEvidence, Workspace, excerpt, extract_patch
from ..workspace.runs import RepoRunLimits, score_patch
from .code import LINT, TESTS, lint_value

PATCH_APPLIES, PATCH_SCOPE = (check_named(n) for n in ("patch_applies", "patch_scope"))
_EXCERPT = 1_500


def _counts(evidence: TestEvidence | None) -> str:
    if evidence is None:
        return "not run"
    if evidence.forgeable:
        return f"{evidence.status} (in process: forgeable)"
    if evidence.counted:
        parts = [f"{evidence.passed} passed, {evidence.failed} failing"]
        if evidence.cannot_cross:
            parts.append(f"{len(evidence.cannot_cross)} cannot be judged (left out)")
        if evidence.flaky:
            parts.append(f"{len(evidence.flaky)} flaky (left out)")
        if evidence.fail_to_pass:
            parts.append(
                f"{evidence.fail_to_pass_passed} of the {evidence.fail_to_pass} failing tests the task names "
                "now pass across the boundary (counted)"
            )
        if evidence.base_failing:
            parts.append(
                f"{evidence.base_failing_passed} of the base's {evidence.base_failing} failing now pass "
                "across the boundary (not counted)"
            )
        if evidence.not_counted:
            parts.append(f"{evidence.not_counted} not counted (not passing on the base, or the patch's own)")
        return f"{', '.join(parts)} ({evidence.status})"
    return evidence.status


def _tests_value(evidence: PatchEvidence, hidden_given: bool) -> tuple[float | None, str, bool]:
    """Share of the counted tests passing after the patch (the base's pass-to-pass tests and the
    hidden ones), what that rests on, and whether it is forgeable. None: nothing could be judged,
    or the task's hidden tests were given and none of them could (a pass would rest on the
    pass-to-pass tests alone, which a no-op patch passes). Only when no test could be counted
    does an in-process run's exit status give the value (1 passed, else 0), forgeable."""
    runs = [e for e in (evidence.tests, evidence.hidden) if e is not None]
    counted = [e for e in runs if e.counted and not e.forgeable]
    total = sum(e.total for e in counted)
    rests = "; ".join(f"{e.rests_on}" for e in counted if e.rests_on)
    hidden_judged = evidence.hidden is not None and evidence.hidden.total > 0
    if hidden_given and not hidden_judged and evidence.hidden is not None and evidence.hidden.counted:
        return None, "none of the task's hidden tests can be judged across the boundary", False
    if total:
        passed = sum(e.passed for e in counted)
        return round(passed / total, 4), f"{passed}/{total} counted tests pass (on: {rests})", False
    if counted:
        return None, "no test can be judged: none passed on the base commit or crossed the boundary", False
    ok = bool(runs) and all(e.status == "passed" for e in runs)
    forgeable = ok and any(e.forgeable for e in runs)
    return (
        (1.0 if ok else 0.0),
        "tests " + ("pass" if ok else "fail") + (" (forgeable)" if forgeable else ""),
        forgeable,
    )


def patch_checks(workspace: Workspace, task: Task, text: str, limits: RepoRunLimits) -> list[CheckResult]:
    """patch_applies, tests, patch_scope, lint for the patch in `text`, run in a fresh sandboxed copy."""
    patch = extract_patch(text)
    return evidence_checks(
        workspace,
        task,
        bool(patch),
        score_patch(workspace, patch, task.constraints.tests, limits, fail_to_pass(task)),
    )


def fail_to_pass(task: Task) -> FailToPass:
    """What the task says of the base's failing tests: its description and `fail_to_pass` list."""
    return FailToPass(task.description, tuple(task.constraints.fail_to_pass))


def evidence_checks(
    workspace: Workspace, task: Task, has_patch: bool, evidence: PatchEvidence
) -> list[CheckResult]:
    """The checks a scored patch's evidence gives."""
    took = f"{evidence.sandbox_s:.2f} s"
    ran = (
        f"sandbox: git apply --check; the base commit's tests ({workspace.test_command}) as plain pytest, a "
        f"secret sample of them and the hidden tests across the boundary; ruff ({took})"
    )
    if evidence.not_run:
        why = f"not_run: {evidence.not_run}"
        return [
            CheckResult(name=PATCH_APPLIES, value=None, evidence=why, ran=ran, not_run=True),
            CheckResult(name=TESTS, value=None, evidence=why, ran=ran, not_run=True),
        ]
    # no report: the job ended first (its limits, or what the patch did to it): `tests` says how
    ended = not evidence.applies and evidence.tests is not None
    applies = CheckResult(
        name=PATCH_APPLIES,
        value=1.0 if evidence.applies else 0.0,
        evidence=(
            (
                f"applies to {workspace.commit[:12]}; changes {', '.join(evidence.changed_files)}"
                if evidence.changed_files
                else f"no change proposed: {workspace.commit[:12]} scored as it is"
            )
            if evidence.applies
            else ("no verdict: " if ended else "does not apply: ")
            + (evidence.apply_output.strip().splitlines() or ["no diff"])[-1]
        ),
        ran="git apply --check" if has_patch else "",
        output=excerpt(evidence.apply_output, _EXCERPT),
    )
    if not evidence.applies:
        said = (
            f"{evidence.apply_output}: tests score 0" if ended else "the patch does not apply: tests score 0"
        )
        return [applies, CheckResult(name=TESTS, value=0.0, evidence=said, ran=ran)]
    hidden_given = bool(task.constraints.tests.strip())
    value, summary, forgeable = _tests_value(evidence, hidden_given)
    before = _counts(workspace.baseline)
    after = _counts(evidence.tests)
    hidden = _counts(evidence.hidden) if hidden_given else "none given"
    failure = next((e.first_failure for e in (evidence.tests, evidence.hidden) if e and e.first_failure), "")
    checks = [
        applies,
        CheckResult(
            name=TESTS,
            value=value,
            evidence=f"{summary}; before: {before}; after: {after}; hidden: {hidden}",
            ran=ran,
            output=excerpt(f"first failure: {failure}" if failure else "all passed", _EXCERPT),
            forgeable=forgeable,
        ),
        CheckResult(
            name=PATCH_SCOPE,
            value=0.0 if evidence.flags else 1.0,
            evidence=(
                "touches what judges it (not counted, and it costs): " + "; ".join(evidence.flags)
                if evidence.flags
                else "touches no test, test configuration, plugin or standard-library name"
            ),
            ran="the changed files, compared with the base commit in the sandbox",
        ),
    ]
    if evidence.ruff_issues is not None:
        checks.append(
            CheckResult(
                name=LINT,
                value=lint_value(evidence.ruff_issues),
                evidence=f"{evidence.ruff_issues} ruff issue(s) in the changed Python files",
                ran="ruff check on the changed files (in the sandbox)",
                output=excerpt(evidence.ruff_output, _EXCERPT),
            )
        )
    return checks


def patch_checker(workspace: Workspace, limits: RepoRunLimits) -> Callable[[Task, str], list[CheckResult]]:
    """The `CodeChecker` of a repository task (scoring and execution feedback)."""

    def check(task: Task, text: str) -> list[CheckResult]:
        return patch_checks(workspace, task, text, limits)

    return check
