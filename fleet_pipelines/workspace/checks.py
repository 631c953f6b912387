"""The checks of a patch proposal on its repository: it applies, the repository's tests and the
hidden tests pass after it, ruff on the changed Python files. Each a `CheckResult` with its
evidence (before and after, the first failure), weighed by `domain.scoring` like any other.
"""

from __future__ import annotations

from collections.abc import Callable

from ..domain.models import Task
from ..domain.scoring import CheckResult
from ..domain.workspace import PatchEvidence, TestEvidence, Workspace, extract_patch
from ..scoring.checks import LINT_PENALTY_PER_ISSUE
from .runs import RepoRunLimits, score_patch

_EXCERPT = 1_500


def _counts(evidence: TestEvidence | None) -> str:
    if evidence is None:
        return "not run"
    if evidence.counted:
        return f"{evidence.passed} passed, {evidence.failed} failing ({evidence.status})"
    return evidence.status


def _tests_value(evidence: PatchEvidence) -> tuple[float, str]:
    """Share of the repository's and the hidden tests passing after the patch; a run that gave no
    counts is 1 when it passed, else 0."""
    runs = [e for e in (evidence.tests, evidence.hidden) if e is not None]
    if all(e.counted for e in runs) and sum(e.total for e in runs):
        passed = sum(e.passed for e in runs)
        total = sum(e.total for e in runs)
        return round(passed / total, 4), f"{passed}/{total} tests pass"
    ok = all(e.status == "passed" for e in runs)
    return (1.0 if ok and runs else 0.0), "tests " + ("pass" if ok and runs else "fail")


def patch_checks(workspace: Workspace, task: Task, text: str, limits: RepoRunLimits) -> list[CheckResult]:
    """patch_applies, tests, lint for the patch in `text`, run in a fresh sandboxed copy."""
    patch = extract_patch(text)
    evidence = score_patch(workspace, patch, task.constraints.tests, limits)
    took = f"{evidence.sandbox_s:.2f} s"
    ran = f"sandbox: git apply --check; {workspace.test_command}; ruff; hidden tests ({took})"
    if evidence.not_run:
        why = f"not_run: {evidence.not_run}"
        return [
            CheckResult(name="patch_applies", value=None, evidence=why, ran=ran, not_run=True),
            CheckResult(name="tests", value=None, evidence=why, ran=ran, not_run=True),
        ]
    applies = CheckResult(
        name="patch_applies",
        value=1.0 if evidence.applies else 0.0,
        evidence=(
            f"applies to {workspace.commit[:12]}; changes {', '.join(evidence.changed_files)}"
            + ("; touches test files" if evidence.touches_tests else "")
            if evidence.applies
            else "does not apply: " + (evidence.apply_output.strip().splitlines() or ["no diff"])[-1]
        ),
        ran="git apply --check" if patch else "",
        output=evidence.apply_output[:_EXCERPT],
    )
    if not evidence.applies:
        tests = CheckResult(
            name="tests", value=0.0, evidence="the patch does not apply: tests score 0", ran=ran
        )
        return [applies, tests]
    value, summary = _tests_value(evidence)
    before = _counts(workspace.baseline)
    after = _counts(evidence.tests)
    hidden = _counts(evidence.hidden) if task.constraints.tests.strip() else "none given"
    failure = next((e.first_failure for e in (evidence.tests, evidence.hidden) if e and e.first_failure), "")
    checks = [
        applies,
        CheckResult(
            name="tests",
            value=value,
            evidence=f"{summary}; before: {before}; after: {after}; hidden: {hidden}",
            ran=ran,
            output=(f"first failure: {failure}" if failure else "all passed")[:_EXCERPT],
        ),
    ]
    if evidence.ruff_issues is not None:
        checks.append(
            CheckResult(
                name="lint",
                value=round(max(0.0, 1.0 - LINT_PENALTY_PER_ISSUE * evidence.ruff_issues), 4),
                evidence=f"{evidence.ruff_issues} ruff issue(s) in the changed Python files",
                ran="ruff check on the changed files (in the sandbox)",
                output=evidence.ruff_output[:_EXCERPT],
            )
        )
    return checks


def patch_checker(workspace: Workspace, limits: RepoRunLimits) -> Callable[[Task, str], list[CheckResult]]:
    """The `CodeChecker` of a repository task (scoring and execution feedback)."""

    def check(task: Task, text: str) -> list[CheckResult]:
        return patch_checks(workspace, task, text, limits)

    return check
