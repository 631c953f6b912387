"""Per-sandbox cgroups on a cgroup v2 tree with delegation (as pods have it), laid out in a temp
dir: this machine's v2 tree has no controllers, so the real v2 files cannot be written here.
The v1 layout is exercised for real by tests/integration/test_sandbox_*.py."""

from __future__ import annotations

import itertools
from pathlib import Path

from fleet_pipelines.sandbox import cgroups

MOUNTINFO = "30 23 0:27 / {root} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n"


def _tree(tmp_path: Path, controllers: str, procs: str = "") -> Path:
    pod = tmp_path / "kubepods" / "pod1"
    pod.mkdir(parents=True)
    (pod / "cgroup.controllers").write_text(controllers)
    (pod / "cgroup.subtree_control").write_text("")
    (pod / "cgroup.procs").write_text(procs)
    return pod


def test_a_delegated_v2_cgroup_gets_children_with_whole_sandbox_limits(tmp_path: Path):
    pod = _tree(tmp_path, "cpuset cpu io memory pids")
    stale = pod / f"{cgroups.PREFIX}999999999-0"  # left by a caller that no longer exists
    stale.mkdir()
    support = cgroups.detect("0::/kubepods/pod1\n", MOUNTINFO.format(root=tmp_path))
    assert support is not None and support.version == 2 and support.parents == {"unified": pod}
    assert (pod / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert support.describe() == "cgroup v2 (memory+swap, pids, cpu)"
    assert not stale.exists()

    group = cgroups.SandboxCgroup.create(support, memory_mb=256, max_processes=16, cpus=0.5)
    child = group.dirs["unified"]
    assert child.parent == pod and child.name.startswith(cgroups.PREFIX)
    assert (child / "memory.max").read_text() == str(256 * 1024 * 1024)
    assert (child / "pids.max").read_text() == "16"
    assert (child / "cpu.max").read_text() == "50000 100000"
    (child / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert group.oom_killed()
    group.add(4242)
    assert (child / "cgroup.procs").read_text() == "4242"


def test_v2_with_memory_only_limits_memory_and_says_so(tmp_path: Path):
    """Delegated memory but not pids (as some hosts do): the process count is left to the run's
    RLIMIT_NPROC in its own user namespace."""
    pod = _tree(tmp_path, "memory io")
    support = cgroups.detect("0::/kubepods/pod1\n", MOUNTINFO.format(root=tmp_path))
    assert support is not None and support.describe() == "cgroup v2 (memory+swap)"
    group = cgroups.SandboxCgroup.create(support, memory_mb=64, max_processes=16, cpus=1)
    assert (group.dirs["unified"] / "memory.max").read_text() == str(64 * 1024 * 1024)
    assert not (group.dirs["unified"] / "pids.max").exists()
    assert (pod / "cgroup.subtree_control").read_text() == "+memory"


def test_v2_without_memory_offered_falls_back_to_none(tmp_path: Path):
    _tree(tmp_path, "cpu io pids")
    assert cgroups.detect("0::/kubepods/pod1\n", MOUNTINFO.format(root=tmp_path)) is None


def test_cgroup_paths_are_read_relative_to_the_mount_root():
    mountinfo = (
        "35 31 0:32 /process_api /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    )
    mounts = cgroups._mounts(mountinfo)
    own = cgroups._own_paths("8:pids:/\n4:memory:/process_api/abc\n0::/\n")
    assert cgroups._dir_of(mounts["memory"], own["memory"]) == Path("/sys/fs/cgroup/memory/abc")
    assert cgroups._dir_of(mounts["pids"], own["pids"]) == Path("/sys/fs/cgroup/pids")


def test_without_a_cgroup_what_a_run_can_hold_fits_its_memory_limit_or_it_is_refused():
    """`bound`: address space per process x processes + /work + /dev/shm never exceeds
    memory_mb without a cgroup; with one, the limits stand as given (the cgroup holds the sum) and
    each process's address space leaves room for every task's untouched malloc arena and stack."""
    from fleet_pipelines.domain.limits import SandboxLimits
    from fleet_pipelines.sandbox.setup import Bound, bound

    assert bound(SandboxLimits(memory_mb=256, max_processes=16), cgroup=False) == Bound(96, 2, 48, 16)
    repo = SandboxLimits(memory_mb=1024, max_processes=64, work_dir_mb=512)
    assert bound(repo, cgroup=False) == Bound(128, 6, 192, 64)  # 1 GiB of tmpfs asked for
    assert bound(repo, cgroup=True) == Bound(1024 + 64 * 72, 64, 512, 512)
    # a program of ours: pid 1 (24 MB) and the program held apart, 4 processes of 170 MB share the rest
    assert bound(repo, cgroup=False, program_mb=64) == Bound(170, 6, 192, 64, pid1_mb=24, program_mb=64)
    assert bound(repo, cgroup=True, program_mb=64) == bound(repo, cgroup=True)  # the cgroup holds it all
    refused = bound(SandboxLimits(memory_mb=100), cgroup=False)
    assert isinstance(refused, str) and refused.startswith("memory limit 100 MB cannot hold a run")
    for memory in range(1, 20_000, 37):
        for processes in (1, 2, 3, 16, 64):
            for work, program in itertools.product((0, 1, 64, 512, 4096), (0, 64)):
                limits = SandboxLimits(memory_mb=memory, max_processes=processes, work_dir_mb=work)
                held = bound(limits, cgroup=False, program_mb=program)
                if isinstance(held, str):
                    continue
                assert held.total_mb <= memory and held.processes <= processes, (limits, held)
                assert held.address_space_mb >= 48 and 1 <= held.work_mb <= max(1, work)
                assert 1 <= held.shm_mb <= max(1, work)  # never 0: a tmpfs of size 0 is unlimited
                own = program if processes > 2 else 0  # room for pid 1, the program and one more
                assert held.program_mb == own and bool(held.pid1_mb) == bool(own), held
