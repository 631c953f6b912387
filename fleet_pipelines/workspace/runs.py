"""Runs on a repository, each in a fresh sandbox (`fleet_pipelines.sandbox`): the workspace bound
read-only at /mnt/repo and copied into the sandbox's own work dir, its dependency environment
read-only at /mnt/env, git and ruff bound read-only. The program that runs there is
`sandbox_job.py` (with `boundary.py` for the counted test sessions); this module builds its job,
keeps the plan of what counts (`TestPlan`) and counts the outcomes against it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import random
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..domain.limits import SandboxLimits
from ..domain.python_ast import parse_module
from ..domain.repomap import executed_ranges
from ..domain.workspace import (
    MAX_PATCH_CHARS,
    FailToPass,
    PatchEvidence,
    TestEvidence,
    Workspace,
    changed_paths,
    doctest_edits,
    excerpt,
    is_test_path,
    patch_flags,
)
from ..linter import RUFF_RULES, ruff_binary
from ..sandbox import TOOL_DIR, SandboxResult, run_python
from .boundary import test_side
from .environment import console_scripts

_JOB = Path(__file__).with_name("sandbox_job.py")
_BOUNDARY = Path(__file__).with_name("boundary.py")
HIDDEN_FILE = "test_fleet_hidden.py"  # boundary.HIDDEN_FILE: the hidden tests' node ids start with it
REPORT_MARK = "FLEET-JOB-REPORT "


@dataclass(frozen=True)
class RepoRunLimits(SandboxLimits):
    """Limits of one repository run: the sandbox's (the same fields), with room for a repository
    and its tests, and a time limit for each command of the run. Threads count as processes
    (pids, RLIMIT_NPROC): 128 leaves room for a test's 100 threads (more-itertools' concurrent_tee
    test) beside the job's own processes. `job_mb`: where no cgroup holds the run, the address
    space of the job itself (sandbox_job.py, ours), whose processes share the rest
    (`sandbox.setup.bound`): its peak was 43 MB with more-itertools' plan and pytest imported.
    `max_output_chars` holds the job's report, which lists every test id's outcome on the base
    and after the patch (packaging 24.1's 7,779 ids: 2.6 MB); the commands' own output in it is
    cut to 4 MB each by the job. A workspace's first job runs the whole suite twice (the base,
    then the patch) beside its sample: `wall_s` and `cpu_s` leave room for suites of a minute
    (more-itertools 11.2.1: 44-49 s on a slow 2-core machine, whose first job passed the 120 s
    this limit once was; chardet 5.2.0: 59 s)."""

    wall_s: float = 300.0
    cpu_s: float = 150.0
    memory_mb: int = 1024
    max_processes: int = 128
    max_file_mb: int = 64
    max_output_chars: int = 16_000_000
    work_dir_mb: int = 512
    command_timeout_s: float = 90.0
    job_mb: int = 64


# What a project's tests may shell out to (`shell=True`, `os.system`, `subprocess.getoutput`, an
# editor or pager command: click's tests edit with `sed` and page with `cat`), bound read-only at
# TOOL_DIR, which the job's commands have on their PATH: the standard utilities, nothing more.
SHELL_TOOLS = ("sh", "cat", "sed", "grep", "head", "tail", "sort", "tr", "wc", "env", "true", "false")
SHELL_TOOLS += ("echo", "printenv", "ls", "cp", "mv", "rm", "mkdir", "touch")


def _run_job(workspace: Workspace, job: dict, limits: RepoRunLimits) -> tuple[dict | None, SandboxResult]:
    mounts = {"repo": workspace.path}
    if workspace.env_path:
        mounts["env"] = workspace.env_path
    git = shutil.which("git")
    ruff = ruff_binary()
    tools = tuple(t for t in (git, ruff, *map(shutil.which, SHELL_TOOLS)) if t)
    job = {
        "subdir": workspace.subdir,
        # the base's own: a patch cannot name one (nor shadow `python` or `pytest`)
        "console_scripts": console_scripts(Path(workspace.path) / workspace.subdir),
        "git": git and f"{TOOL_DIR}/{Path(git).name}",
        "ruff": ruff and f"{TOOL_DIR}/{Path(ruff).name}",
        "ruff_rules": RUFF_RULES,
        "tool_dir": TOOL_DIR,
        **job,
    }
    if "visible_args" in job or job.get("hidden_tests"):
        job["boundary_source"] = _BOUNDARY.read_text()
    job["timeout_s"] = limits.command_timeout_s
    files = {"job.json": json.dumps(job)}
    if job.get("visible_args") is not None and job.get("patch") is not None:
        files["zygote"] = ""  # plain pytest runs: the job starts its zygote before reading the job
    result = run_python(
        _JOB.read_text(), limits, files=files, mounts=mounts, tools=tools, program_mb=limits.job_mb
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith(REPORT_MARK)]
    try:
        report = json.loads(lines[-1].removeprefix(REPORT_MARK)) if lines else None
    except ValueError:
        report = None
    if report is None and result.status == "passed" and len(result.stdout) > limits.max_output_chars:
        why = f"the job's report was cut: its output passed max_output_chars ({limits.max_output_chars:,})"
        return None, dataclasses.replace(result, status="error", reason=why)
    return report, result


def _unfinished(result: SandboxResult, ran: str) -> TestEvidence:
    status = (
        "not_run" if result.status == "not_run" else ("timeout" if result.status == "timeout" else "error")
    )
    return TestEvidence(
        status=status,
        ran=ran,
        first_failure=result.reason,
        output=excerpt(result.stderr or result.stdout),
        duration_s=result.duration_s,
    )


def baseline(workspace: Workspace, limits: RepoRunLimits = RepoRunLimits()) -> TestEvidence:
    """The repository's test command on the workspace as checked out; when it is pytest and tests
    fail, the lines of the code those tests execute (`TestEvidence.executed`), traced in the same
    sandbox job by running them again (at most 10, with the command's arguments, in the time the
    job has left)."""
    job = {
        "test_command": workspace.test_command,
        "trace_args": pytest_args(workspace.test_command),
        "wall_s": limits.wall_s,
    }
    report, result = _run_job(workspace, job, limits)
    if report is None or "tests" not in report:
        return _unfinished(result, workspace.test_command)
    evidence = TestEvidence.model_validate(report["tests"])
    found = report.get("executed")
    if isinstance(found, dict):  # written in the code under test's process: checked, bounded
        lines = {
            str(test): {
                str(p): [n for n in v if isinstance(n, int)] for p, v in per.items() if isinstance(v, list)
            }
            for test, per in found.items()
            if isinstance(per, dict)
        }
        evidence = evidence.model_copy(update={"executed": executed_ranges(lines)})
    return evidence


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
        tree = parse_module(source)
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


def hidden_session_ids(source: str) -> list[str]:
    """The hidden tests' functions and methods, each run in a session of its own (a fresh state:
    nothing the code wrote for one test is there for the next); [] (one session for all) where
    pytest may collect tests their source does not name: a class not named Test* with bases (a
    `unittest.TestCase`), a test bound by assignment."""
    try:
        tree = parse_module(source)
    except SyntaxError:
        return []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.bases and not node.name.startswith("Test"):
            return []
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.startswith("test") for t in targets):
                return []
    return hidden_test_ids(source)


@dataclass(frozen=True)
class TestPlan:
    """What counts, fixed on the base commit before the patch (SWE-bench's way): each test id's
    outcome under plain pytest with the test command's arguments (`base`; those that pass there
    are the pass-to-pass tests), the sampled pass-to-pass tests that also pass across the
    boundary (`crossable`: re-run across it after a patch, to catch a forged plain report), the
    hidden tests' ids, each "boundary" or "cannot_cross" (on the base it compared an object of the
    code that holds no plain value, or handed the code what cannot cross: it cannot be judged,
    and is left out), the flaky tests (their outcome
    differed between two base runs: left out), and `named`: the crossable tests named after what
    the hidden tests import (`sandbox_job.named_ids`), re-run across the boundary after every
    patch, not drawn: code that answers the hidden tests across the boundary otherwise than the
    project's own tests in pytest contradicts their plain report there."""

    __test__ = False  # not a pytest class

    visible_args: list[str] | None
    base: dict[str, str]
    crossable: tuple[str, ...]
    hidden: dict[str, str]
    flaky: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    named: tuple[str, ...] = ()

    @property
    def passing(self) -> list[str]:
        """The pass-to-pass tests: they passed on the base and are not flaky."""
        return [i for i, o in self.base.items() if o == "passed" and i not in self.flaky]

    @property
    def failing(self) -> list[str]:
        """The base's failing tests (not skipped, not xfailed) that a fix may make pass: run
        across the boundary after a patch; counted in the score only when the task names them
        (its fail-to-pass tests, SWE-bench's rule), and the evaluation's selector key counts
        those that pass."""
        return [i for i, o in self.base.items() if o == "failed" and i not in self.flaky][:MAX_FAILING]


MAX_PLANS = 256  # plans kept per process (a workspace and hidden tests each), oldest dropped first
PLAN_SAMPLE = 24  # pass-to-pass tests tried across the boundary on the base, per plan
JOB_SAMPLE = 12  # of those that crossed, re-run across the boundary after each patch (drawn per job)
NAMED_SAMPLE = 24  # pass-to-pass tests named after what the hidden tests import, sampled besides
MAX_FAILING = 50  # the base's failing tests re-run across the boundary after a patch (fixed?)
MAX_RECHECK = 200  # regressed tests re-run on the base to tell a flaky one (more: a breaking patch)
FAILING_IDS_KEPT = 50  # failing ids an evidence lists (benchmarks/real_suites.py raises it)
WALL_RESERVE_S = 10.0  # a job's own start, copy, apply, ruff and sample beside its plain runs
CPU_SHARE = 0.8  # of a process's CPU limit, the most the baseline's run may take
_PLANS: dict[tuple[str, ...], TestPlan] = {}
_PLANS_LOCK = threading.Lock()
_RANDOM = random.SystemRandom()  # the sample is the host's secret: the patch cannot aim at it


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
    base = report.get("plan_plain", {}).get("outcomes", {})
    sample = report.get("plan_sample", {}).get("results", {})
    crossable = tuple(i for i, r in sample.items() if r["outcome"] == "passed" and base.get(i) == "passed")
    hidden = _modes(report["plan_hidden"], hidden_test_ids(hidden_tests)) if hidden_tests.strip() else {}
    notes = []
    if args is not None and not base:
        notes.append(f"pytest reported no test of the base commit with {args or 'no arguments'}")
    named = tuple(i for i in report.get("plan_named", []) if i in crossable)
    return TestPlan(args, base, crossable, hidden, frozenset(), tuple(notes), named)


def _plan_done(report: dict) -> bool:
    """Whether the base's runs finished (a plan made of a cut run is not kept); the sample's
    session may end at its budget: the tests that crossed by then are the sample."""
    plain_done = "plan_plain" not in report or not report["plan_plain"]["timeout"]
    return plain_done and report.get("plan_hidden", {"done": True}).get("done", False)


@dataclass
class _Tally:
    """Counted tests' outcomes as they are read: passes, failures, the failing ids (the first
    `FAILING_IDS_KEPT`) and the first failure's text."""

    passed: int = 0
    failed: int = 0
    failing: list[str] = dataclasses.field(default_factory=list)
    first: str = ""

    def count(self, test_id: str, ok: bool, why: Callable[[], str]) -> None:
        """One test: a pass, or a failure whose text (`why()`) is kept when it is the first."""
        if ok:
            self.passed += 1
            return
        self.failed += 1
        if len(self.failing) < FAILING_IDS_KEPT:
            self.failing.append(test_id)
        if not self.first:
            self.first = why()


def counted_evidence(modes: dict[str, str], session: dict, ran: str, timeout_s: float) -> TestEvidence:
    """A boundary session's outcomes counted against the plan: a counted test passes only when it
    reported passing; skipped, error, deselected and not reported count as failed; tests that
    could not cross on the base cannot be judged: listed, left out (whatever the patch does:
    leaving them out never depends on it); tests the plan does not hold are not counted."""
    results = session.get("results", {})
    errors = session.get("collect_errors") or []
    collect_error = f"collecting {errors[0][0] or 'the tests'} failed:\n{errors[0][1]}" if errors else ""
    tally = _Tally()
    cannot = [i for i, mode in modes.items() if mode == "cannot_cross"]
    for test_id, mode in modes.items():
        if mode == "cannot_cross":
            continue
        got = results.get(test_id)
        tally.count(
            test_id,
            bool(got) and got["outcome"] == "passed",
            lambda i=test_id, g=got: (
                f"{i}: {g['outcome']}\n{g['detail']}" if g else f"{i}: not reported\n{collect_error}"
            ).strip(),
        )
    passed, failed, failing, first = tally.passed, tally.failed, tally.failing, tally.first
    if session.get("timeout"):
        status, first = "timeout", first or f"timed out after {timeout_s:g} s"
    elif not session.get("done") or session.get("harness_error"):
        status = "error"
        first = first or session.get("harness_error") or "the test process ended before its report"
    else:
        status = "passed" if passed and failed == 0 else "failed"
        if not passed + failed:
            first = first or "no test can be judged: none crossed the boundary on the base commit"
    return TestEvidence(
        status=status,
        ran=ran,
        passed=passed,
        failed=failed,
        failing=failing,
        first_failure=excerpt(first),
        output=session.get("output", ""),
        duration_s=session.get("duration_s", 0.0),
        counted=True,
        cannot_cross=cannot,
        not_counted=len([i for i in results if i not in modes]),
        rests_on=f"{passed + failed} across the boundary",
    )


def pass_to_pass_evidence(
    plan: TestPlan, report: dict, timeout_s: float, fail_to_pass: FailToPass | None = None
) -> tuple[TestEvidence, TestPlan]:
    """The pass-to-pass tests after the patch, the fail-to-pass ones (the base's failing tests the
    task names: each passes only when it passed across the boundary), and the plan as this job
    found it (its flaky tests, the sample the boundary can judge).

    Each counts as plain pytest reported it on the patched copy (a regression fails it); a
    sampled one re-run across the boundary passes only when it passed there too. A sampled test
    the boundary failed while the plain report says it passed is run across it again, alone; if
    it fails there too, it contradicts that report: none of its other passes counts then (a
    forged report hides regressions; it can never raise a score above the patch's honest one).
    Unless it also failed alone across the boundary on the base, which the patch cannot touch
    (a test whose outcome there is chance, as one seeding `random` in the test process while the
    code draws in its own): the boundary cannot judge it, its plain outcome counts, and it
    leaves the sample, now and in later jobs. A regressed test whose outcome on the base
    differed when run again there is flaky: listed and left out, now and in later jobs."""
    plain = report["plain"]
    outcomes = plain["outcomes"]
    crossed = dict(report.get("visible", {}).get("results", {}))
    for test_id, again in report.get("visible_again", {}).items():  # alone, in a session of its own
        if test_id in again.get("results", {}):
            crossed[test_id] = again["results"][test_id]
    flaky = set(plan.flaky)
    uncrossable = {  # failed alone across the boundary on the base as well: it cannot judge them
        i
        for i, s in report.get("visible_base", {}).items()
        if s.get("results", {}).get(i, {}).get("outcome") != "passed"
    }
    if "base_recheck" in report:
        again = report["base_recheck"]["outcomes"]
        flaky |= {i for i in plan.passing if outcomes.get(i) != "passed" and again.get(i) != "passed"}
    contradicted = sorted(
        i
        for i, r in crossed.items()
        if i in plan.crossable
        and i not in uncrossable
        and r["outcome"] in ("failed", "skipped")
        and outcomes.get(i) == "passed"
    )

    def unreported(test_id: str) -> str:  # a collection error, an exit on import: the run says why
        return "" if test_id in outcomes else "\n" + excerpt(plain["output"], 1_000)

    judged_across = 0
    tally = _Tally()
    for test_id in plan.base:
        if plan.base[test_id] != "passed" or test_id in flaky:
            continue
        got = crossed.get(test_id)
        ok = outcomes.get(test_id) == "passed"
        detail = outcomes.get(test_id, "not reported")
        across = test_id in plan.crossable and test_id not in uncrossable
        if ok and got and got["outcome"] != "cannot_cross" and across:
            judged_across += 1  # the boundary can fail a plain pass, never pass a plain failure
            ok, detail = got["outcome"] == "passed", got["detail"]
        elif ok and contradicted:
            ok, detail = False, "its plain report is contradicted by the boundary: not trusted"
        tally.count(test_id, ok, lambda i=test_id, d=detail: f"{i}: {d}".strip() + unreported(i))
    named = fail_to_pass.among(plan.failing) if fail_to_pass else []
    for test_id in named:
        got = crossed.get(test_id)
        tally.count(
            test_id,
            bool(got) and got["outcome"] == "passed",
            lambda i=test_id, g=got: (
                f"{i} (named by the task, failing on the base): "
                + (f"{g['outcome']}\n{g['detail']}" if g else "not reported")
            ).strip(),
        )
    passed, failed, failing, first = tally.passed, tally.failed, tally.failing, tally.first
    if contradicted:
        first = (
            f"the plain report says {', '.join(contradicted[:5])} passed; across the boundary they did "
            f"not: the plain report is not trusted\n{first}"
        )
    fixed = [i for i in plan.failing if crossed.get(i, {}).get("outcome") == "passed"]
    not_counted = len([i for i in plan.base if plan.base[i] != "passed"]) - len(named)
    not_counted += len([i for i in outcomes if i not in plan.base])
    if plain["timeout"]:
        status, first = "timeout", first or f"timed out after {timeout_s:g} s"
    else:
        status = "passed" if failed == 0 else "failed"
    sampled = f", {judged_across} of them re-run across the boundary" if judged_across else ""
    if named:
        sampled += f"; {len(named)} fail-to-pass across the boundary"
    evidence = TestEvidence(
        status=status,
        ran=plain["ran"],
        passed=passed,
        failed=failed,
        failing=failing,
        first_failure=excerpt(first),
        output=plain["output"],
        duration_s=plain["duration_s"],
        counted=True,
        not_counted=not_counted,
        flaky=sorted(flaky),
        contradicted=contradicted,
        base_failing=len(plan.failing) - len(named),
        base_failing_passed=len([i for i in fixed if i not in named]),
        fail_to_pass=len(named),
        fail_to_pass_passed=len([i for i in fixed if i in named]),
        rests_on=f"{passed + failed - len(named)} pass-to-pass in plain pytest{sampled}",
    )
    crossable = tuple(i for i in plan.crossable if i not in uncrossable)
    named = tuple(i for i in plan.named if i in crossable)
    return evidence, dataclasses.replace(plan, flaky=frozenset(flaky), crossable=crossable, named=named)


def over_limits(workspace: Workspace, limits: RepoRunLimits, planning: bool) -> str:
    """Why a patch's job cannot finish within `limits`, judged from the base alone (the
    baseline's duration), or "": plain pytest runs the whole suite once in every job and once more
    on the base in a workspace's first (`planning`), each test process holds `cpu_s` of CPU, and
    a job past `wall_s` is killed with no verdict. chardet 5.2.0's 754 tests take 60 s here: under
    the 120 s limit of then, every patch was killed and scored 0, the honest ones too."""
    took = workspace.baseline.duration_s if workspace.baseline else 0.0
    runs = 2 if planning else 1
    if took * runs + WALL_RESERVE_S > limits.wall_s:
        return (
            f"the repository's tests take {took:.0f} s (its baseline) and a patch's job runs them {runs} "
            f"time{'s' * (runs > 1)}: over the run's wall-clock limit of {limits.wall_s:g} s "
            "(raise the repos resource's runs.wall_s)"
        )
    if took > CPU_SHARE * limits.cpu_s:
        return (
            f"the repository's tests take {took:.0f} s (its baseline): too near the CPU limit of "
            f"{limits.cpu_s:g} s of each process of a run (raise the repos resource's runs.cpu_s)"
        )
    return ""


def score_patch(
    workspace: Workspace,
    patch: str,
    hidden_tests: str = "",
    limits: RepoRunLimits = RepoRunLimits(),
    fail_to_pass: FailToPass | None = None,
) -> PatchEvidence:
    """`patch` in a fresh sandboxed copy of the workspace: `git apply --check`, apply (an empty
    patch is scored: the base as it is), the base commit's tests as plain pytest (with the
    patch's changes to tests, conftest.py and pytest configuration undone) and a secret sample
    of them and the base's failing tests (those `fail_to_pass` names count) across the boundary,
    ruff on the changed Python files, then the hidden tests across the boundary; each command in
    a fresh state (`sandbox_job.py`). A test command that is not pytest runs in process: forgeable.
    What counts is the plan's (`TestPlan`), made by the first patch's job on the base commit
    before it applies the patch, and kept per process."""
    changed = changed_paths(patch)
    if len(patch) > MAX_PATCH_CHARS:
        return PatchEvidence(
            applies=False, apply_output=f"patch over {MAX_PATCH_CHARS} characters: not applied"
        )
    start = time.monotonic()
    key = _plan_key(workspace, hidden_tests)
    with _PLANS_LOCK:
        plan = _PLANS.get(key)
    too_long = over_limits(workspace, limits, plan is None)
    if too_long:
        return PatchEvidence(applies=False, changed_files=changed, not_run=too_long)
    tests_own = test_side_files(workspace.path, workspace.subdir, workspace.commit)
    args = pytest_args(workspace.test_command)
    job: dict = {
        "patch": patch,
        "plan": plan is None,  # not known yet: the base commit's sessions run first, in this job
        "visible_args": args,
        "ruff_changed": changed,
        "hidden_tests": hidden_tests,
        "hidden_ids": hidden_session_ids(hidden_tests),
        "base_paths": [p for p in changed if _judges(p) or p in tests_own],
        "max_recheck": MAX_RECHECK,
        "max_failing": MAX_FAILING,
    }
    if plan is None:
        job.update(seed=_RANDOM.getrandbits(64), sample_size=PLAN_SAMPLE, named_size=NAMED_SAMPLE)
    elif args is not None:
        job["pass_to_pass"] = plan.passing
        drawn = [i for i in plan.crossable if i not in plan.named]
        sample = _RANDOM.sample(drawn, min(JOB_SAMPLE, len(drawn)))
        job["boundary_ids"] = [*plan.named, *sample, *plan.failing]
    if args is None:
        job["test_command"] = workspace.test_command
        # the unpatched repository's tests reported through pytest: the patched ones must too
        job["require_report"] = bool(workspace.baseline and workspace.baseline.counted)
    report, result = _run_job(workspace, job, limits)
    took = round(time.monotonic() - start, 3)
    if report is not None and plan is None:
        plan = _plan_from(report, args, hidden_tests)
        if _plan_done(report):
            _keep(key, plan)
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
        changed,
        workspace.subdir,
        sys.stdlib_module_names,
        report.get("pytest_config_changed", []),
        tests_own,
        doctest_edits(patch),
    )
    timeout = limits.command_timeout_s
    if "plain" in report:
        tests, found = pass_to_pass_evidence(plan, report, timeout, fail_to_pass)
        if found != plan:
            _keep(key, found)
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
        apply_output=report.get("apply_output", "") or ("" if patch.strip() else "no change proposed"),
        changed_files=changed,
        touches_tests=any(f.endswith((": test file", ": conftest.py")) for f in flags),
        flags=flags,
        tests=tests,
        hidden=hidden,
        ruff_issues=report.get("ruff_issues"),
        ruff_output=report.get("ruff_output") or "",
        sandbox_s=took,
    )


@functools.lru_cache(maxsize=MAX_PLANS)
def test_side_files(path: str, subdir: str, commit: str) -> tuple[str, ...]:
    """The base commit's test-side modules (`boundary.test_side`: the rule the test process
    applies), as paths of the repository: flagged as test edits, and kept as the base has them
    in the plain run; `commit` keys the cache."""
    return tuple(str(PurePosixPath(subdir, f)) for f in test_side(str(Path(path, subdir))).files)


def _judges(path: str) -> bool:
    """Whether a changed path is of the test side (a test file, conftest.py): the plain run
    keeps the base's version of it."""
    return is_test_path(path) or PurePosixPath(path).name == "conftest.py"


def _keep(key: tuple[str, ...], plan: TestPlan) -> None:
    with _PLANS_LOCK:
        _PLANS[key] = plan
        while len(_PLANS) > MAX_PLANS:
            del _PLANS[next(iter(_PLANS))]  # the oldest


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
        return excerpt(f"tests {tests.status}{counts}\n{tests.first_failure or tests.output}", 4_000)
    report, result = _run_job(workspace, {"tool": name, "args": arguments}, limits)
    if report is None:
        return f"error: the tool run ended before its report: {result.reason}"
    return str(report.get("tool_output", ""))
