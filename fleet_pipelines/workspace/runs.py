"""Runs on a repository, each in a fresh sandbox (`fleet_pipelines.sandbox`): the workspace bound
read-only at /mnt/repo and copied into the sandbox's own work dir, its dependency environment
read-only at /mnt/env, git and ruff bound read-only. The program that runs there is
`sandbox_job.py`; this module builds its job and reads back its report.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..domain.workspace import (
    MAX_PATCH_CHARS,
    PatchEvidence,
    TestEvidence,
    Workspace,
    changed_paths,
    is_test_path,
)
from ..sandbox import TOOL_DIR, SandboxLimits, SandboxResult, run_python
from ..scoring.checks import RUFF_RULES, ruff_binary

_JOB = Path(__file__).with_name("sandbox_job.py")
REPORT_MARK = "FLEET-JOB-REPORT "


@dataclass(frozen=True)
class RepoRunLimits(SandboxLimits):
    """Limits of one repository run: the sandbox's (the same fields), with room for a repository
    and its tests, and a time limit for each command of the run."""

    wall_s: float = 120.0
    cpu_s: float = 60.0
    memory_mb: int = 1024
    max_processes: int = 64
    max_file_mb: int = 64
    max_output_chars: int = 400_000
    work_dir_mb: int = 512
    command_timeout_s: float = 90.0


def _run_job(workspace: Workspace, job: dict, limits: RepoRunLimits) -> tuple[dict | None, SandboxResult]:
    mounts = {"repo": workspace.path}
    if workspace.env_path:
        mounts["env"] = workspace.env_path
    git = shutil.which("git")
    ruff = ruff_binary()
    tools = tuple(t for t in (git, ruff) if t)
    job = {
        "subdir": workspace.subdir,
        "git": git and f"{TOOL_DIR}/{Path(git).name}",
        "ruff": ruff and f"{TOOL_DIR}/{Path(ruff).name}",
        "ruff_rules": RUFF_RULES,
        **job,
    }
    job["timeout_s"] = limits.command_timeout_s
    result = run_python(
        _JOB.read_text(), limits, files={"job.json": json.dumps(job)}, mounts=mounts, tools=tools
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith(REPORT_MARK)]
    if not lines:
        return None, result
    try:
        return json.loads(lines[-1].removeprefix(REPORT_MARK)), result
    except ValueError:
        return None, result


def _unfinished(result: SandboxResult, ran: str) -> TestEvidence:
    status = (
        "not_run" if result.status == "not_run" else ("timeout" if result.status == "timeout" else "error")
    )
    return TestEvidence(
        status=status,
        ran=ran,
        first_failure=result.reason,
        output=(result.stderr or result.stdout)[-1_500:],
        duration_s=result.duration_s,
    )


def baseline(workspace: Workspace, limits: RepoRunLimits = RepoRunLimits()) -> TestEvidence:
    """The repository's test command on the workspace as checked out."""
    report, result = _run_job(workspace, {"test_command": workspace.test_command}, limits)
    if report is None or "tests" not in report:
        return _unfinished(result, workspace.test_command)
    return TestEvidence.model_validate(report["tests"])


def score_patch(
    workspace: Workspace, patch: str, hidden_tests: str = "", limits: RepoRunLimits = RepoRunLimits()
) -> PatchEvidence:
    """`patch` in a fresh sandboxed copy of the workspace: `git apply --check`, apply, the test
    command, ruff on the changed Python files, then the hidden tests."""
    changed = changed_paths(patch)
    touches = any(is_test_path(p) for p in changed)
    if not patch.strip():
        return PatchEvidence(applies=False, apply_output="the proposal holds no unified diff")
    if len(patch) > MAX_PATCH_CHARS:
        return PatchEvidence(
            applies=False, apply_output=f"patch over {MAX_PATCH_CHARS} characters: not applied"
        )
    start = time.monotonic()
    job = {
        "patch": patch,
        "test_command": workspace.test_command,
        # the unpatched repository's tests reported through pytest: the patched ones must too
        "require_report": bool(workspace.baseline and workspace.baseline.counted),
        "ruff_changed": changed,
        "hidden_tests": hidden_tests,
    }
    report, result = _run_job(workspace, job, limits)
    took = round(time.monotonic() - start, 3)
    if report is None:
        unfinished = _unfinished(result, workspace.test_command)
        return PatchEvidence(
            applies=False,
            apply_output=f"the run ended before its report: {result.reason}",
            changed_files=changed,
            touches_tests=touches,
            tests=unfinished,
            sandbox_s=took,
            not_run=result.reason if result.status in ("not_run", "error") else "",
        )
    return PatchEvidence(
        applies=bool(report.get("applies")),
        apply_output=report.get("apply_output", ""),
        changed_files=changed,
        touches_tests=touches,
        tests=TestEvidence.model_validate(report["tests"]) if "tests" in report else None,
        hidden=TestEvidence.model_validate(report["hidden"]) if "hidden" in report else None,
        ruff_issues=report.get("ruff_issues"),
        ruff_output=report.get("ruff_output") or "",
        sandbox_s=took,
    )


def run_tool(workspace: Workspace, name: str, arguments: dict, limits: RepoRunLimits) -> str:
    """One agent tool in a fresh sandbox against the read-only workspace: list_files, read_file,
    search_text (in `sandbox_job.py`), or run_tests (the test command, with a patch applied when
    given). Returns what the agent reads back, bounded; a failure is reported as text."""
    if name == "run_tests":
        patch = str(arguments.get("patch") or "")
        job: dict = {"test_command": workspace.test_command}
        if patch.strip():
            if len(patch) > MAX_PATCH_CHARS:
                return f"error: patch over {MAX_PATCH_CHARS} characters"
            job["patch"] = patch if patch.endswith("\n") else patch + "\n"
        report, result = _run_job(workspace, job, limits)
        if report is None:
            return f"error: the run ended before its report: {result.reason}"
        if report.get("applies") is False:
            return f"the patch does not apply:\n{report.get('apply_output', '')}"
        tests = TestEvidence.model_validate(report["tests"])
        counts = f" ({tests.passed} passed, {tests.failed} failing)" if tests.counted else ""
        return f"tests {tests.status}{counts}\n{tests.first_failure or tests.output}"[:4_000]
    report, result = _run_job(workspace, {"tool": name, "args": arguments}, limits)
    if report is None:
        return f"error: the tool run ended before its report: {result.reason}"
    return str(report.get("tool_output", ""))
