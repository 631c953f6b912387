"""One cgroup per sandbox run: memory (shared memory and tmpfs pages included, no swap), process
count and CPU bandwidth limits on the whole sandbox, not per process.

Two layouts are supported, whichever is writable by this process:
- **cgroup v2 with delegation** (pods on current Kubernetes, systemd user slices): a child of the
  process's own cgroup, with `memory` (and `pids`, `cpu` where offered: without `pids`, the
  process count is bounded by RLIMIT_NPROC in the run's own user namespace) enabled in its
  `cgroup.subtree_control`. When that cgroup holds processes, they are first moved to a
  `fleet-leaf` child, as the "no internal processes" rule requires;
- **cgroup v1** (this machine and CI): a child of the process's own cgroup in each of the `memory`,
  `pids` and (when mounted) `cpu` hierarchies.

Each sandbox cgroup is named `fleet-sandbox-<pid>-<n>`; ones left behind by a caller that died are
removed by the next caller on the same tree. Where neither layout is writable, `CgroupSupport` is
unavailable and the sandbox falls back to per-process rlimits (the check's evidence says so).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "fleet-sandbox-"
LEAF = "fleet-leaf"
_NEEDED_V1 = ("memory", "pids")
_OPTIONAL_V1 = ("cpu",)
_CPU_PERIOD_US = 100_000
_counter = itertools.count()


@dataclass(frozen=True)
class CgroupSupport:
    """Where sandbox cgroups go: `version` 1 or 2, and the parent dir per controller."""

    version: int
    parents: dict[str, Path]  # v1: controller -> parent dir; v2: {"unified": parent}

    def describe(self) -> str:
        controllers = (
            "memory+swap" + (", pids" if self.has("pids") else "") + (", cpu" if self.has("cpu") else "")
        )
        return f"cgroup v{self.version} ({controllers})"

    def has(self, controller: str) -> bool:
        """Whether sandbox cgroups get this controller's limit (memory always does)."""
        if self.version == 1:
            return controller in self.parents
        return controller in _controllers(self.parents["unified"] / "cgroup.subtree_control")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _controllers(path: Path) -> set[str]:
    return {word.lstrip("+") for word in _read(path).split()}


def _own_paths(proc_self_cgroup: str) -> dict[str, str]:
    """Controller (or "unified") -> this process's cgroup path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in proc_self_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            paths["unified"] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def _mounts(mountinfo: str) -> dict[str, tuple[str, str]]:
    """Controller (or "unified") -> (mount point, root of the mount), from /proc/self/mountinfo."""
    mounts: dict[str, tuple[str, str]] = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = fields[3], fields[4].encode().decode("unicode_escape")
        if tail[0] == "cgroup2":
            mounts.setdefault("unified", (point, root))
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                mounts.setdefault(option, (point, root))
    return mounts


def _dir_of(mount: tuple[str, str], own: str) -> Path:
    point, root = mount
    rel = os.path.relpath(own, root) if root != "/" else own.lstrip("/")
    return Path(point) / ("" if rel == "." else rel)


def _remove_stale(parent: Path) -> None:
    """Empty sandbox cgroups of callers that no longer exist."""
    for child in parent.glob(PREFIX + "*"):
        match = re.fullmatch(PREFIX + r"(\d+)-\d+", child.name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            with contextlib.suppress(OSError):
                child.rmdir()


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK) and os.access(path / "cgroup.procs", os.W_OK)


def _enable_v2(parent: Path) -> bool:
    """memory (pids and cpu where offered) enabled for the children of `parent`."""
    offered = _controllers(parent / "cgroup.controllers")
    if "memory" not in offered:
        return False
    wanted = [c for c in ("memory", "pids", "cpu") if c in offered]
    if set(wanted) <= _controllers(parent / "cgroup.subtree_control"):
        return True
    control = " ".join(f"+{c}" for c in wanted)
    try:
        (parent / "cgroup.subtree_control").write_text(control)
        return True
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            return False
    # Our cgroup holds processes (ours among them): v2 allows controllers for children only on a
    # cgroup without processes, so they move to a `fleet-leaf` child first (delegation lets the
    # owner of a subtree organise it).
    leaf = parent / LEAF
    try:
        leaf.mkdir(exist_ok=True)
        for pid in _read(parent / "cgroup.procs").split():
            with contextlib.suppress(OSError):  # exited meanwhile, or a kernel thread
                (leaf / "cgroup.procs").write_text(pid)
        (parent / "cgroup.subtree_control").write_text(control)
        return True
    except OSError:
        return False


def detect(proc_self_cgroup: str | None = None, mountinfo: str | None = None) -> CgroupSupport | None:
    """The cgroup layout this process may create sandbox cgroups in, or None."""
    own = _own_paths(proc_self_cgroup if proc_self_cgroup is not None else _read(Path("/proc/self/cgroup")))
    mounts = _mounts(mountinfo if mountinfo is not None else _read(Path("/proc/self/mountinfo")))
    if "unified" in mounts and "unified" in own:
        parent = _dir_of(mounts["unified"], own["unified"])
        if parent.name == LEAF:  # moved there by an earlier detect: sandboxes go beside it
            parent = parent.parent
        if _writable(parent) and _enable_v2(parent):
            _remove_stale(parent)
            return CgroupSupport(2, {"unified": parent})
    parents = {}
    for controller in (*_NEEDED_V1, *_OPTIONAL_V1):
        if controller in mounts and controller in own:
            parent = _dir_of(mounts[controller], own[controller])
            if _writable(parent):
                parents[controller] = parent
    if all(c in parents for c in _NEEDED_V1):
        for parent in parents.values():
            _remove_stale(parent)
        return CgroupSupport(1, parents)
    return None


@dataclass
class SandboxCgroup:
    """The cgroup(s) of one sandbox run: limits at creation, `add` a process, `kill`, `close`."""

    support: CgroupSupport
    dirs: dict[str, Path]

    @classmethod
    def create(cls, support: CgroupSupport, memory_mb: int, max_processes: int, cpus: float) -> SandboxCgroup:
        name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        dirs = {key: parent / name for key, parent in support.parents.items()}
        group = cls(support, {})
        try:
            for key, path in dirs.items():
                path.mkdir()
                group.dirs[key] = path
            group._limit(memory_mb * 1024 * 1024, max_processes, cpus)
        except BaseException:
            group.close()
            raise
        return group

    def _path(self, controller: str) -> Path:
        return self.dirs["unified" if self.support.version == 2 else controller]

    def _limit(self, memory: int, max_processes: int, cpus: float) -> None:
        quota = max(1_000, int(cpus * _CPU_PERIOD_US))
        if self.support.version == 2:
            unified = self.dirs["unified"]
            (unified / "memory.max").write_text(str(memory))
            if (unified / "memory.swap.max").exists():
                (unified / "memory.swap.max").write_text("0")
            if self.support.has("pids"):
                (unified / "pids.max").write_text(str(max_processes))
            if self.support.has("cpu"):
                (unified / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")
            return
        mem = self.dirs["memory"]
        (mem / "memory.limit_in_bytes").write_text(str(memory))
        if (mem / "memory.memsw.limit_in_bytes").exists():  # memory + swap: no swapping out
            (mem / "memory.memsw.limit_in_bytes").write_text(str(memory))
        (self.dirs["pids"] / "pids.max").write_text(str(max_processes))
        if "cpu" in self.dirs:
            (self.dirs["cpu"] / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
            (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))

    def add(self, pid: int) -> None:
        """Moves `pid` in; its children from then on are created inside."""
        for path in self.dirs.values():
            (path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return [int(p) for p in _read(self._path("pids") / "cgroup.procs").split()]

    def kill(self) -> None:
        """SIGKILL to every process inside (a forking one is caught by the repeat)."""
        if self.support.version == 2 and (self.dirs["unified"] / "cgroup.kill").exists():
            try:
                (self.dirs["unified"] / "cgroup.kill").write_text("1")
                return
            except OSError:
                pass
        for _ in range(20):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this sandbox at its memory limit."""
        if self.support.version == 2:
            events = _read(self.dirs["unified"] / "memory.events")
        else:
            events = _read(self.dirs["memory"] / "memory.oom_control")
        match = re.search(r"^oom_kill (\d+)$", events, re.M)
        if match:
            return int(match.group(1)) > 0
        return self.support.version == 1 and int(_read(self.dirs["memory"] / "memory.failcnt") or 0) > 0

    def close(self) -> None:
        """Kills what is left and removes the cgroup dirs (retried while the last exits)."""
        if not self.dirs:
            return
        self.kill()
        deadline = time.monotonic() + 2.0
        for path in list(self.dirs.values()):
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    self.kill()
                    time.sleep(0.005)
        self.dirs = {}
