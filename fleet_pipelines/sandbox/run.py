"""Running in the sandbox that `setup` builds: a script (`run_python`) or a solution with its tests
(`run_tests`), every exit path killing the whole sandbox, output bounded."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from ..domain.limits import SandboxLimits
from . import cgroups
from .setup import (
    OWN_UID,
    SANDBOX_ENV,
    SANDBOX_UID,
    Bound,
    SandboxResult,
    Setup,
    TestRun,
    Unavailable,
    bound,
    candidate,
    mount_binds,
    sandbox_uid,
    seccomp_filter,
    tool_binds,
)

DEFAULT_LIMITS = SandboxLimits()


def _probe(setup: Setup) -> tuple[bool, str]:
    try:
        result = _run(
            setup, "script", {"main.py": "import socket\nsocket.socket().close()\n"}, SandboxLimits(wall_s=20)
        )
    except OSError as exc:  # e.g. root without CAP_SETUID cannot take a sandbox uid
        return False, f"probe run failed: {exc!r}"
    if result.status != "passed":
        return False, f"probe run failed: {result.reason}: {result.stderr[-300:]}"
    return True, setup.isolation()


@functools.cache
def _setup() -> Setup | tuple[None, str]:
    """The sandbox built and probed once per process, falling back where the host refuses a part;
    where none can be had, said once (a warning at the first use of the sandbox)."""
    setup = _built()
    if isinstance(setup, tuple):
        logging.getLogger("fleet_pipelines.sandbox").warning(_unavailable(setup[1]))
    return setup


def _built() -> Setup | tuple[None, str]:
    setup = candidate()
    if isinstance(setup, tuple):
        return setup
    root = setup.own_uid
    ok, why = _probe(setup)
    if not ok and "Can't mount proc" in why:
        # A container whose /proc has masked paths (procMount: Default): the kernel refuses a new
        # proc mount, so the sandbox gets no /proc rather than the container's.
        setup = dataclasses.replace(setup, proc=False)
        ok, why = _probe(setup)
    if not ok and setup.cgroup is not None:  # a cgroup tree we may write but not use: rlimits only
        setup = dataclasses.replace(setup, cgroup=None)
        ok, why = _probe(setup)
    if not ok and root:
        why = f"{OWN_UID}: {why}"
    return setup if ok else (None, why)


def isolation_available() -> tuple[bool, str]:
    """(True, the isolation in force) or (False, why nothing can run); probed once per process."""
    setup = _setup()
    if isinstance(setup, tuple):
        return False, setup[1]
    return True, setup.isolation()


def unavailable_warning() -> str | None:
    """What to warn about when the sandbox cannot run (None when it can): `fleet dev` prints it at
    start-up, and every process logs it at its first use of the sandbox."""
    ok, why = isolation_available()
    return None if ok else _unavailable(why)


def _unavailable(why: str) -> str:
    return (
        "the sandbox is unavailable, so no proposal's code will run: every runs and tests check "
        f"will be not_run and no winner will pass winner_passes_checks ({why})"
    )


def run_python(
    source: str,
    limits: SandboxLimits = DEFAULT_LIMITS,
    files: dict[str, str] | None = None,
    mounts: dict[str, str] | None = None,
    tools: tuple[str, ...] = (),
    program_mb: int = 0,
) -> SandboxResult:
    """Runs `source` as main.py in a fresh work dir holding `files` (relative path -> text).
    `mounts` (name -> host dir) appear read-only at /mnt/NAME; `tools` (host executables such as
    git) at /fleet/bin/NAME, read-only, with the libraries they load. `program_mb`: the source is
    ours and runs no untrusted code in its own process, which is then held to that address space
    (its soft limit; its children raise theirs to the hard limit) where no cgroup holds the run,
    leaving the rest to the processes it starts (`setup.bound`)."""
    setup = _setup()
    if isinstance(setup, tuple):
        return _refused("script", f"no isolation: {setup[1]}", "")
    try:
        extra = [*mount_binds(setup, mounts or {}), *tool_binds(tuple(tools), setup.own_uid)]
    except Unavailable as exc:  # the runtime folder is another user's: no readable copy of a tool
        return _refused("script", f"no isolation: {OWN_UID}: {exc}", setup.isolation())
    files = {**(files or {}), "main.py": source}
    return _run(setup, "script", files, limits, extra_binds=extra, program_mb=program_mb)


def run_tests(
    solution: str,
    examples: list[tuple[str, str]],
    tests: str,
    limits: SandboxLimits = DEFAULT_LIMITS,
    entry_points: Sequence[str] = (),
) -> TestRun:
    """The examples (call, expected) and the test code against `solution` (solution.py), the
    solution in its own process; outcomes come back on a channel only the test process holds.
    `entry_points`: names the tests mean the solution's by, before any builtin of that name."""
    setup = _setup()
    if isinstance(setup, tuple):
        return _refused("tests", f"no isolation: {setup[1]}", "")
    harness = {"examples": examples, "tests": tests, "entry_points": list(entry_points)}
    return _run(setup, "tests", {"solution.py": solution}, limits, harness)


def _refused(mode: str, reason: str, isolation: str) -> SandboxResult | TestRun:
    """A run that did not start: `not_run`, and why."""
    result = SandboxResult("not_run", None, "", "", 0.0, reason, isolation)
    return result if mode == "script" else TestRun(result)


def _read_truncated(stream: IO[bytes], max_chars: int) -> str:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    if size <= max_chars:
        return stream.read().decode(errors="replace")
    half = max_chars // 2
    head = stream.read(half).decode(errors="replace")
    stream.seek(size - half)
    tail = stream.read().decode(errors="replace")
    return f"{head}\n...[{size - 2 * half} bytes truncated]...\n{tail}"


def _check_names(files: dict[str, str]) -> None:
    for name in files:
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or ".." in parts:
            raise ValueError(f"sandbox file name must be relative and inside the work dir: {name!r}")


def _memfd(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name)  # close-on-exec; Popen's pass_fds hands it to bwrap only
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _argv(
    setup: Setup, held: Bound, info_fd: int, block_fd: int, seccomp_fd: int, extra_binds: list[str]
) -> list[str]:
    mb = 1024 * 1024
    argv = [setup.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += ["--as-pid-1"]  # pid 1 is our init.py under its rlimits, not a bwrap init one could write to
    argv += ["--unshare-user", "--disable-userns"]  # no nested user namespace: no caps to be had inside
    argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox"]
    argv += ["--info-fd", str(info_fd), "--block-fd", str(block_fd), "--clearenv"]
    if seccomp_fd >= 0:
        argv += ["--seccomp", str(seccomp_fd)]
    for key, value in SANDBOX_ENV.items():
        argv += ["--setenv", key, value]
    argv += [
        *setup.binds,
        *extra_binds,
        *(["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"] if setup.proc else []),
    ]
    argv += ["--dev", "/dev"]
    argv += ["--size", str(held.shm_mb * mb), "--tmpfs", "/dev/shm"]
    argv += ["--size", str(held.work_mb * mb), "--perms", "0700", "--tmpfs", "/work"]
    argv += ["--ro-bind", setup.init, "/fleet/init.py", "--remount-ro", "/", "--chdir", "/work"]
    return argv


def _signal_of(returncode: int | None) -> str | None:
    """bwrap exits with 128 + N when the program died of signal N (as a shell reports it)."""
    if returncode is None or not 128 < returncode < 128 + signal.NSIG:
        return None
    try:
        return signal.Signals(returncode - 128).name
    except ValueError:
        return None


def _outcome(returncode: int | None, limits: SandboxLimits, stderr: str, oom: bool) -> tuple[str, str]:
    name = _signal_of(returncode)
    if name is not None:
        if name == "SIGXCPU":
            return "timeout", f"CPU time limit ({limits.cpu_s:g} s) exceeded"
        if name == "SIGXFSZ":
            return "failed", f"file size limit ({limits.max_file_mb} MB) exceeded"
        if oom:
            return "failed", f"memory limit ({limits.memory_mb} MB, whole sandbox) reached: killed"
        return "failed", f"killed by {name}"
    if returncode == 0:
        return "passed", "exit code 0"
    if oom:
        return (
            "failed",
            f"exit code {returncode}: memory limit ({limits.memory_mb} MB, whole sandbox) reached",
        )
    if "MemoryError" in stderr:
        return "failed", f"exit code {returncode}: memory limit ({limits.memory_mb} MB) reached"
    return "failed", f"exit code {returncode}"


def _run(
    setup: Setup,
    mode: str,
    files: dict[str, str],
    limits: SandboxLimits,
    harness: dict | None = None,
    extra_binds: list[str] | None = None,
    program_mb: int = 0,
):
    _check_names(files)
    held = bound(limits, setup.cgroup is not None, program_mb)
    if isinstance(held, str):
        return _refused(mode, f"not run: {held}", setup.isolation())
    spec = {
        "files": files,
        "env": SANDBOX_ENV,
        "limits": {
            "cpu_s": max(1, int(limits.cpu_s)),
            "address_space_mb": held.address_space_mb,
            "processes": held.processes,
            "pid1_mb": held.pid1_mb,
            "program_mb": held.program_mb,
            "max_file_mb": limits.max_file_mb,
        },
        **(harness or {}),
    }
    opened: list[int] = []
    group = None
    process = None
    timed_out = False
    start = time.monotonic()
    try:
        spec_fd = _memfd("fleet-spec", json.dumps(spec).encode())
        opened.append(spec_fd)
        result_fd = _memfd("fleet-results") if mode == "tests" else -1
        if result_fd >= 0:
            opened.append(result_fd)
        seccomp = seccomp_filter()
        seccomp_fd = _memfd("fleet-seccomp", seccomp) if seccomp else -1
        if seccomp_fd >= 0:
            opened.append(seccomp_fd)
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        ready_r, ready_w = os.pipe()  # init.py writes a byte, then closes it, before the program runs
        opened += [info_r, info_w, block_r, block_w, ready_r, ready_w]
        if setup.cgroup is not None:
            group = cgroups.SandboxCgroup.create(
                setup.cgroup, limits.memory_mb, limits.max_processes, limits.cpus
            )
        command = [setup.python, "-I", "-S", "/fleet/init.py", mode, str(spec_fd), str(ready_w)]
        if result_fd >= 0:
            command.append(str(result_fd))
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(tempfile.TemporaryFile())
            err = stack.enter_context(tempfile.TemporaryFile())
            try:
                uid = stack.enter_context(sandbox_uid()) if setup.own_uid else None
            except Unavailable as exc:  # the uid pool's folder is another user's, or all taken
                return _refused(mode, f"no isolation: {OWN_UID}: {exc}", setup.isolation())
            process = subprocess.Popen(
                [*_argv(setup, held, info_w, block_r, seccomp_fd, extra_binds or []), "--", *command],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=tuple(
                    fd for fd in (spec_fd, result_fd, info_w, block_r, ready_w, seccomp_fd) if fd >= 0
                ),
                start_new_session=True,
                env={},
                cwd="/",
                user=uid,
                group=uid,
                extra_groups=None if uid is None else [],
            )
            for fd in (info_w, block_r, ready_w):
                os.close(fd)
                opened.remove(fd)
            info = _read_info(info_r, limits.wall_s)
            if group is not None and "child-pid" in info:
                group.add(info["child-pid"])  # before the program runs: it is inside from its start
            with contextlib.suppress(BrokenPipeError):  # bwrap failed first: reported below
                os.write(block_w, b"go")
            timed_out = not _wait_exit(process, max(0.1, limits.wall_s - (time.monotonic() - start)))
            duration = time.monotonic() - start
            _kill(process, group)
            oom = group is not None and group.oom_killed()
            stdout = _read_truncated(out, limits.max_output_chars)
            stderr = _read_truncated(err, limits.max_output_chars)
            results = _read_fd(result_fd) if result_fd >= 0 else ""
            started = _started(ready_r)
    finally:
        if process is not None and process.poll() is None:
            _kill(process, group)
        if group is not None:
            group.close()
        for fd in opened:
            os.close(fd)
    returncode = process.returncode
    isolation = setup.isolation(limits, program_mb)
    if not started:  # only bwrap and init.py ran: what they printed is theirs
        why = "wall time limit reached" if timed_out else f"exit code {returncode}"
        status, reason = "error", f"sandbox setup failed ({why}): {stderr.strip()[-300:]}"
    elif timed_out:
        status, reason = "timeout", f"wall time limit ({limits.wall_s:g} s) exceeded; sandbox killed"
    else:
        status, reason = _outcome(returncode, limits, stderr, oom)
    result = SandboxResult(status, returncode, stdout, stderr, round(duration, 3), reason, isolation)
    if mode == "script":
        return result
    return _test_run(result, results, limits)


def _wait_exit(process: subprocess.Popen, timeout_s: float) -> bool:
    """Whether bwrap exited within `timeout_s`, seen the moment it does: through a pidfd where
    the kernel has them. (`Popen.wait(timeout)` polls with sleeps of up to 50 ms, ~25 ms lost on
    every run.)"""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfd (kernel < 5.3, not Linux): Popen's own polling
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        return _readable(pidfd, timeout_s)
    finally:
        os.close(pidfd)


def _readable(fd: int, timeout_s: float) -> bool:
    """Whether `fd` becomes readable within `timeout_s` (poll: any fd number, where select()
    refuses those past 1023, which a run's process with Ray and gRPC open may hand out)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout_s * 1000))))


def _read_info(fd: int, timeout_s: float) -> dict:
    """bwrap's --info-fd JSON (the sandbox's pid 1 as `child-pid`); {} if bwrap failed first."""
    chunks = []
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if not _readable(fd, left):
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {}


def _started(ready: int) -> bool:
    """Whether init.py reported the setup done (the program started) on its ready pipe: the
    host's own channel, closed inside the sandbox before any code of the program runs."""
    os.set_blocking(ready, False)
    try:
        return os.read(ready, 1) == b"R"
    except BlockingIOError:
        return False


def _read_fd(fd: int) -> str:
    size = os.lseek(fd, 0, os.SEEK_END)
    return os.pread(fd, size, 0).decode(errors="replace") if size else ""


def _kill(process: subprocess.Popen, group: cgroups.SandboxCgroup | None) -> None:
    """The whole sandbox: every process of its cgroup, and bwrap (whose death takes pid 1 and so
    the pid namespace with it)."""
    if group is not None:
        group.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _test_run(result: SandboxResult, results: str, limits: SandboxLimits) -> TestRun:
    outcomes: list[dict] = []
    complete = False
    solution_exit = ""
    for line in results.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("done"):
            complete, solution_exit = True, str(entry.get("solution", ""))
        elif isinstance(entry.get("name"), str) and isinstance(entry.get("passed"), bool):
            outcomes.append(entry)
    if "SIGXCPU" in solution_exit:
        reason = f"CPU time limit ({limits.cpu_s:g} s) exceeded by the solution"
        result = SandboxResult(
            "timeout",
            result.returncode,
            result.stdout,
            result.stderr,
            result.duration_s,
            reason,
            result.isolation,
        )
    return TestRun(result, outcomes if (outcomes or complete) else None, complete, solution_exit)
