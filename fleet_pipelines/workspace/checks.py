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
    if evidence.forgeable:
        return f"{evidence.status} (in process: forgeable)"
    if evidence.counted:
        cannot = f", {len(evidence.cannot_cross)} cannot cross" if evidence.cannot_cross else ""
        extra = f", {evidence.not_counted} not the base's (not counted)" if evidence.not_counted else ""
        return f"{evidence.passed} passed, {evidence.failed} failing{cannot}{extra} ({evidence.status})"
    return evidence.status


def _tests_value(evidence: PatchEvidence) -> tuple[float, str, bool]:
    """Share of the counted tests (the base commit's and the hidden ones, run across the
    boundary) passing after the patch, and whether it is forgeable: only when no test could be
    counted does an in-process run's exit status give the value (1 passed, else 0), forgeable."""
    runs = [e for e in (evidence.tests, evidence.hidden) if e is not None]
    counted = [e for e in runs if e.counted and not e.forgeable]
    total = sum(e.total for e in counted)
    if total:
        passed = sum(e.passed for e in counted)
        return round(passed / total, 4), f"{passed}/{total} counted tests pass", False
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
        workspace, task, bool(patch), score_patch(workspace, patch, task.constraints.tests, limits)
    )


def evidence_checks(
    workspace: Workspace, task: Task, has_patch: bool, evidence: PatchEvidence
) -> list[CheckResult]:
    """The checks a scored patch's evidence gives."""
    took = f"{evidence.sandbox_s:.2f} s"
    ran = (
        f"sandbox: git apply --check; the base commit's tests ({workspace.test_command}) and the hidden "
        f"tests across the boundary; ruff ({took})"
    )
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
            if evidence.applies
            else "does not apply: " + (evidence.apply_output.strip().splitlines() or ["no diff"])[-1]
        ),
        ran="git apply --check" if has_patch else "",
        output=evidence.apply_output[:_EXCERPT],
    )
    if not evidence.applies:
        tests = CheckResult(
            name="tests", value=0.0, evidence="the patch does not apply: tests score 0", ran=ran
        )
        return [applies, tests]
    value, summary, forgeable = _tests_value(evidence)
    before = _counts(workspace.baseline)
    after = _counts(evidence.tests)
    hidden = _counts(evidence.hidden) if task.constraints.tests.strip() else "none given"
    failure = next((e.first_failure for e in (evidence.tests, evidence.hidden) if e and e.first_failure), "")
    cannot = sum(len(e.cannot_cross) for e in (evidence.tests, evidence.hidden) if e is not None)
    if cannot:
        summary += (
            f" ({cannot} need objects of the code under test: they cannot cross the boundary and count "
            "as not passed)"
        )
    checks = [
        applies,
        CheckResult(
            name="tests",
            value=value,
            evidence=f"{summary}; before: {before}; after: {after}; hidden: {hidden}",
            ran=ran,
            output=(f"first failure: {failure}" if failure else "all passed")[:_EXCERPT],
            forgeable=forgeable,
        ),
        CheckResult(
            name="patch_scope",
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
