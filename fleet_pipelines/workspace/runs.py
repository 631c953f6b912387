"""Runs on a repository, each in a fresh sandbox (`fleet_pipelines.sandbox`): the workspace bound
read-only at /mnt/repo and copied into the sandbox's own work dir, its dependency environment
read-only at /mnt/env, git and ruff bound read-only. The program that runs there is
`sandbox_job.py` (with `boundary.py` for the counted test sessions); this module builds its job,
keeps the plan of what counts (`TestPlan`) and counts the outcomes against it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import shlex
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..domain.limits import SandboxLimits
from ..domain.workspace import (
    MAX_PATCH_CHARS,
    PatchEvidence,
    TestEvidence,
    Workspace,
    changed_paths,
    is_test_path,
    patch_flags,
)
from ..sandbox import TOOL_DIR, SandboxResult, run_python
from ..scoring.checks import RUFF_RULES, ruff_binary

_JOB = Path(__file__).with_name("sandbox_job.py")
_BOUNDARY = Path(__file__).with_name("boundary.py")
HIDDEN_FILE = "test_fleet_hidden.py"  # boundary.HIDDEN_FILE: the hidden tests' node ids start with it
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
    if "visible_args" in job or job.get("hidden_tests"):
        job["boundary_source"] = _BOUNDARY.read_text()
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


_RUN_CONTROL = {"-x", "--exitfirst", "--sw", "--stepwise", "--sw-skip", "--stepwise-skip", "--lf"}
_RUN_CONTROL |= {"--last-failed", "--ff", "--failed-first", "--nf", "--new-first", "--pdb", "--trace"}


def pytest_args(test_command: str) -> list[str] | None:
    """The arguments a test command gives pytest (`pytest ARGS`, `python -m pytest ARGS`), less
    the options that stop or reorder a run; None when the command is not pytest."""
    try:
        argv = shlex.split(test_command)
    except ValueError:
        return None
    if argv and Path(argv[0]).name in ("pytest", "py.test"):
        rest = argv[1:]
    elif len(argv) >= 3 and Path(argv[0]).name.startswith("python") and argv[1:3] == ["-m", "pytest"]:
        rest = argv[3:]
    else:
        return None
    return [a for a in rest if a not in _RUN_CONTROL and not a.startswith("--maxfail")]


def hidden_test_ids(source: str) -> list[str]:
    """The node ids pytest gives the hidden tests' functions and methods (without parameters),
    read from their source: counted even when they cannot be collected on the base commit."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    ids = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            ids.append(f"{HIDDEN_FILE}::{node.name}")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            ids += [
                f"{HIDDEN_FILE}::{node.name}::{m.name}"
                for m in node.body
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name.startswith("test")
            ]
    return ids


@dataclass(frozen=True)
class TestPlan:
    """What counts, fixed on the base commit before the patch: the base's test ids (collected
    across the boundary with the test command's arguments) and the hidden tests' ids, each
    "boundary" or "cannot_cross" (it needed an object of the code under test on the base)."""

    __test__ = False  # not a pytest class

    visible_args: list[str] | None
    visible: dict[str, str]
    hidden: dict[str, str]
    notes: tuple[str, ...] = ()


MAX_PLANS = 256  # plans kept per process (a workspace and hidden tests each), oldest dropped first
_PLANS: dict[tuple[str, ...], TestPlan] = {}
_PLANS_LOCK = threading.Lock()


def _modes(session: dict, extra: list[str] = ()) -> dict[str, str]:
    results = session.get("results", {})
    ids = [*session.get("collected", []), *results]
    ids += [i for i in extra if not any(c == i or c.startswith(i + "[") for c in ids)]
    return {
        i: "cannot_cross" if results.get(i, {}).get("outcome") == "cannot_cross" else "boundary"
        for i in dict.fromkeys(ids)
    }


def _plan_key(workspace: Workspace, hidden_tests: str) -> tuple[str, ...]:
    digest = hashlib.sha256(hidden_tests.encode()).hexdigest()
    return (workspace.path, workspace.commit, workspace.subdir, workspace.test_command, digest)


def _plan_from(report: dict, args: list[str] | None, hidden_tests: str) -> TestPlan:
    visible = _modes(report["plan_visible"]) if "plan_visible" in report else {}
    hidden = _modes(report["plan_hidden"], hidden_test_ids(hidden_tests)) if hidden_tests.strip() else {}
    notes = []
    if args is not None and not visible:
        notes.append(f"pytest collected no test of the base commit with {args or 'no arguments'}")
    return TestPlan(args, visible, hidden, tuple(notes))


def counted_evidence(modes: dict[str, str], session: dict, ran: str, timeout_s: float) -> TestEvidence:
    """A boundary session's outcomes counted against the plan: a counted test passes only when it
    reported passing; skipped, error, deselected and not reported count as failed, so do tests
    that cannot cross; tests the plan does not hold are not counted."""
    results = session.get("results", {})
    errors = session.get("collect_errors") or []
    collect_error = f"collecting {errors[0][0] or 'the tests'} failed:\n{errors[0][1]}" if errors else ""
    passed = failed = 0
    failing: list[str] = []
    first = ""
    cannot = [i for i, mode in modes.items() if mode == "cannot_cross"]
    for test_id, mode in modes.items():
        got = results.get(test_id)
        if mode == "boundary" and got and got["outcome"] == "passed":
            passed += 1
            continue
        failed += 1
        if mode == "cannot_cross":
            continue
        if len(failing) < 50:
            failing.append(test_id)
        if not first:
            detail = got["detail"] if got else collect_error
            first = f"{test_id}: {got['outcome'] if got else 'not reported'}\n{detail}".strip()
    if session.get("timeout"):
        status, first = "timeout", first or f"timed out after {timeout_s:g} s"
    elif not session.get("done") or session.get("harness_error"):
        status = "error"
        first = first or session.get("harness_error") or "the test process ended before its report"
    else:
        status = "passed" if modes and failed == 0 else "failed"
        if not modes:
            first = "no test counts: the base commit had none pytest collects"
    return TestEvidence(
        status=status,
        ran=ran,
        passed=passed,
        failed=failed,
        failing=failing,
        first_failure=first[:1_500],
        output=session.get("output", ""),
        duration_s=session.get("duration_s", 0.0),
        counted=True,
        cannot_cross=cannot,
        not_counted=len([i for i in results if i not in modes]),
    )


def score_patch(
    workspace: Workspace, patch: str, hidden_tests: str = "", limits: RepoRunLimits = RepoRunLimits()
) -> PatchEvidence:
    """`patch` in a fresh sandboxed copy of the workspace: `git apply --check`, apply, the base
    commit's tests across the boundary (else the test command, in process: forgeable), ruff on
    the changed Python files, then the hidden tests across the boundary; each command in a fresh
    state (`sandbox_job.py`). What counts is the plan's (`TestPlan`), made by the first patch's
    job on the base commit before it applies the patch, and kept per process."""
    changed = changed_paths(patch)
    if not patch.strip():
        return PatchEvidence(applies=False, apply_output="the proposal holds no unified diff")
    if len(patch) > MAX_PATCH_CHARS:
        return PatchEvidence(
            applies=False, apply_output=f"patch over {MAX_PATCH_CHARS} characters: not applied"
        )
    start = time.monotonic()
    key = _plan_key(workspace, hidden_tests)
    with _PLANS_LOCK:
        plan = _PLANS.get(key)
    args = pytest_args(workspace.test_command)
    job: dict = {
        "patch": patch,
        "plan": plan is None,  # not known yet: the base commit's sessions run first, in this job
        "visible_args": args,
        "ruff_changed": changed,
        "hidden_tests": hidden_tests,
    }
    if args is None:
        job["test_command"] = workspace.test_command
        # the unpatched repository's tests reported through pytest: the patched ones must too
        job["require_report"] = bool(workspace.baseline and workspace.baseline.counted)
    report, result = _run_job(workspace, job, limits)
    took = round(time.monotonic() - start, 3)
    if report is not None and plan is None:
        plan = _plan_from(report, args, hidden_tests)
        if all(report[s].get("done") for s in ("plan_visible", "plan_hidden") if s in report):
            with _PLANS_LOCK:
                _PLANS[key] = plan
                while len(_PLANS) > MAX_PLANS:
                    del _PLANS[next(iter(_PLANS))]  # the oldest
    if report is None or plan is None:
        unfinished = _unfinished(result, workspace.test_command)
        return PatchEvidence(
            applies=False,
            apply_output=f"the run ended before its report: {result.reason}",
            changed_files=changed,
            touches_tests=any(is_test_path(p) for p in changed),
            tests=unfinished,
            sandbox_s=took,
            not_run=result.reason if result.status in ("not_run", "error") else "",
        )
    changed = report.get("changed", changed)
    flags = patch_flags(
        changed, workspace.subdir, sys.stdlib_module_names, report.get("pytest_config_changed", [])
    )
    timeout = limits.command_timeout_s
    if "visible" in report:
        ran = (
            f"the base commit's tests across the boundary: pytest {' '.join(plan.visible_args or [])}".strip()
        )
        tests = counted_evidence(plan.visible, report["visible"], ran, timeout)
    elif "tests" in report:
        tests = TestEvidence.model_validate(report["tests"]).model_copy(update={"forgeable": True})
    else:
        tests = None
    hidden = None
    if "hidden" in report:
        hidden = counted_evidence(
            plan.hidden, report["hidden"], "the task's hidden tests across the boundary", timeout
        )
    return PatchEvidence(
        applies=bool(report.get("applies")),
        apply_output=report.get("apply_output", ""),
        changed_files=changed,
        touches_tests=any(f.endswith((": test file", ": conftest.py")) for f in flags),
        flags=flags,
        tests=tests,
        hidden=hidden,
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
