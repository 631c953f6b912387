"""The sandbox against a hostile program that exhausts resources: memory (one allocation, many
processes, memfd and /dev/shm), processes (a fork bomb beside a neighbour), CPU, wall time,
output; and, without a writable cgroup, the per-process limits that still hold the memory limit."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import textwrap
import uuid

import pytest

from fleet_pipelines.domain.limits import SandboxLimits
from tests.integration.sandbox_identities import (
    SYSTEM_PYTHON,
    Box,
    _driver,
    assert_fork_bomb_spares_its_neighbour,
    guard_box_tests,
    identity_box,  # noqa: F401 (the fixture `box`)
    python_call,
)

# --- resources: the whole sandbox is limited, not each process ---


def test_one_huge_allocation_fails(box: Box):
    result = box.python("x = bytearray(4 * 1024**3)\nprint('allocated')")
    assert result.status == "failed" and "allocated" not in result.stdout
    assert "memory limit" in result.reason


HOLDERS = textwrap.dedent(
    """
    import os, time
    children = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            block = b"x" * (100 * 1024 * 1024)  # touched, resident
            time.sleep(3)
            os._exit(0)  # 0 only for a child that held its 100 MiB for the whole time
        children.append(pid)
    print("held", sum(os.waitpid(pid, 0)[1] == 0 for pid in children), flush=True)
    """
)


def test_processes_together_cannot_exceed_the_memory_limit(box: Box):
    """4 x 100 MiB against 256 MiB: each is under the per-process limit, together they are not."""
    result = box.python(HOLDERS, SandboxLimits(wall_s=15, cpu_s=5, memory_mb=256, max_processes=16))
    held = int(result.stdout.split()[-1]) if "held" in result.stdout else 0
    assert held < 4, result


def test_memfd_is_refused_and_shared_memory_counts_against_the_memory_limit(box: Box):
    """memfd pages are outside every rlimit: memfd_create is refused; /dev/shm is a capped tmpfs."""
    program = textwrap.dedent(
        """
        import os
        try:
            os.memfd_create("hog")
            print("memfd allowed")
        except OSError as exc:
            print("memfd refused", exc.strerror)
        written = 0
        try:
            with open("/dev/shm/hog", "wb") as f:
                for _ in range(300):
                    written += f.write(b"x" * (1 << 20))
                    f.flush()
        except OSError as exc:
            print("shm refused", exc.strerror)
        print("wrote", written >> 20, "MiB", flush=True)
        """
    )
    limits = SandboxLimits(wall_s=15, cpu_s=5, memory_mb=128, max_file_mb=1024)
    result = box.python(program, limits)
    assert "memfd refused Operation not permitted" in result.stdout, result
    assert "wrote 300 MiB" not in result.stdout, result


def test_a_fork_bomb_is_contained_and_the_neighbour_is_unaffected(box: Box):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    neighbour = textwrap.dedent(
        """
        import os, time
        time.sleep(1)  # the bomb is at its limit by now
        pids = []
        for _ in range(8):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            pids.append(pid)
        print(sum(os.waitpid(p, 0)[1] == 0 for p in pids), "children")
        """
    )
    limits = SandboxLimits(wall_s=4, cpu_s=3, max_processes=16)
    alone = box.python(neighbour, limits)
    bombing, beside = box.many([python_call(bomb, limits), python_call(neighbour, limits)])
    assert bombing.status in ("timeout", "failed")
    assert (beside.status, beside.stdout) == (alone.status, alone.stdout) == ("passed", "8 children\n")


def test_a_memory_hog_leaves_a_concurrent_sandbox_result_unchanged(box: Box):
    hog = "blocks = []\nwhile True:\n    blocks.append(b'x' * (32 << 20))\n"
    work = "import time\ntime.sleep(1)\nprint(sum(i * i for i in range(200_000)))\n"
    limits = SandboxLimits(wall_s=8, cpu_s=4, memory_mb=192)
    alone = box.python(work, limits)
    hogging, beside = box.many([python_call(hog, limits), python_call(work, limits)])
    assert hogging.status == "failed" and "memory limit" in hogging.reason
    assert (beside.status, beside.stdout) == (alone.status, alone.stdout)


THREADS = textwrap.dedent(
    """
    import threading
    go = threading.Event()
    def work():
        block = [0] * 100_000  # a malloc in the thread: glibc gives it its own arena
        go.wait()
    threads = []
    try:
        for _ in range(48):
            threads.append(threading.Thread(target=work))
            threads[-1].start()
    except RuntimeError as exc:
        print("refused", exc)
    go.set()
    for thread in threads:
        thread.join()
    print("started", len(threads))
    """
)


def test_threads_up_to_the_process_limit_start_and_the_memory_limit_still_holds(box: Box):
    """A thread reserves address space it never touches (an arena, a stack): held to the memory
    limit per process, 256 MB allowed 2 of these 48 threads; the cgroup still holds what is touched."""
    limits = SandboxLimits(wall_s=8, cpu_s=3, memory_mb=256, max_processes=64)
    threads = box.python(THREADS, limits)
    assert threads.stdout == "started 48\n", threads
    hog = box.python("blocks = []\nwhile True:\n    blocks.append(b'x' * (32 << 20))\n", limits)
    assert hog.status == "failed" and "memory limit" in hog.reason, hog


def test_an_infinite_loop_hits_the_cpu_limit(box: Box):
    result = box.python("while True:\n    pass\n", SandboxLimits(wall_s=8, cpu_s=1))
    assert result.status == "timeout" and "CPU time limit" in result.reason


def test_a_daemonised_grandchild_dies_at_the_wall_limit(box: Box):
    marker = f"fleet-daemon-{uuid.uuid4().hex}"
    program = textwrap.dedent(
        f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])
            os._exit(0)
        time.sleep(300)
        """
    )
    result = box.python(program, SandboxLimits(wall_s=2, cpu_s=2))
    assert result.status == "timeout" and "wall time limit" in result.reason
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1


def test_output_is_truncated_head_and_tail(box: Box):
    result = box.python("print('A' * 50_000 + 'END')", SandboxLimits(max_output_chars=1_000))
    assert len(result.stdout) < 1_200 and result.stdout.startswith("A") and "END" in result.stdout
    assert "truncated" in result.stdout


# --- without a writable cgroup: rlimits per process, shrunk to hold the memory limit ---


FILLS_THE_WORK_DIR = textwrap.dedent(
    """
    written = 0
    try:
        with open("/work/fill", "wb") as f:
            for _ in range(300):
                written += f.write(b"x" * (1 << 20))
                f.flush()
    except OSError as exc:
        print("refused", exc.strerror)
    print("wrote", written >> 20, "MiB", flush=True)
    """
)


OUR_PROGRAM = textwrap.dedent(
    """
    import os, resource
    MB = 1 << 20
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    print("program", soft // MB, hard // MB)
    pid1 = [line for line in open("/proc/1/limits") if line.startswith("Max address space")]
    print("pid 1", int(pid1[0].split()[3]) // MB)
    try:
        block = bytearray(80 * MB)
        print("program allocated 80")
    except MemoryError:
        print("program refused 80", flush=True)
    pid = os.fork()
    if pid == 0:  # a process of the code under test
        for target in (os.getppid(), 1):
            try:
                resource.prlimit(target, resource.RLIMIT_AS, (hard, hard))
                print("raised", target)
            except OSError as exc:
                print("prlimit refused", exc.errno)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        block = bytearray(120 * MB)
        print("child allocated 120", flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    """
)


def test_without_a_writable_cgroup_the_limits_shrink_to_hold_the_memory_limit():
    """As uid 65534 without a delegated cgroup: per-process rlimits, each sandbox in its own user
    namespace (RLIMIT_NPROC per namespace), so a neighbour's fork bomb still cannot starve it;
    the address space, the process count and the tmpfs sizes shrink so that together they stay
    within the memory limit (4 x 100 MiB held against 256 MiB before they did), the evidence
    states that bound, and a limit too small to hold any run is refused, never run unbounded.
    A program of ours (`program_mb`, the repository job) and pid 1 are held to address spaces of
    their own, which the code under test cannot raise, and the processes it starts share the
    rest: 4 of 170 MB under 1024 MB, where they were 6 of 128 MB counting pid 1 and the job."""
    if not (os.geteuid() == 0 and shutil.which("setpriv") and os.path.exists(SYSTEM_PYTHON)):
        pytest.fail("needs root (to drop to uid 65534), setpriv and /usr/bin/python3")
    driver = _driver([])
    try:
        plain = Box("no cgroup", driver)
        assert "limits: rlimits per process (no writable cgroup)" in plain.isolation
        assert_fork_bomb_spares_its_neighbour(plain)
        assert plain.python("open('/etc/passwd')").status == "failed"
        limits = SandboxLimits(wall_s=15, cpu_s=5, memory_mb=256, max_processes=16, max_file_mb=1024)
        repo_like = SandboxLimits(wall_s=15, cpu_s=5, memory_mb=1024, max_processes=64, work_dir_mb=512)
        held, filled, repo, refused, ours = plain.many(
            [
                python_call(HOLDERS, limits),
                python_call(FILLS_THE_WORK_DIR, limits),
                python_call(FILLS_THE_WORK_DIR, dataclasses.replace(repo_like, max_file_mb=1024)),
                python_call("print('ran')", SandboxLimits(memory_mb=100)),
                python_call(OUR_PROGRAM, repo_like, program_mb=64),
            ]
        )
        assert "held" not in held.stdout or int(held.stdout.split()[-1]) < 4, held
        bound = (
            "memory bound for the whole sandbox 256 MB <= memory limit 256 MB: 96 MB address space "
            "per process x 2 processes + 48 MB /work + 16 MB /dev/shm"
        )
        assert bound in held.isolation, held
        assert "refused No space left on device" in filled.stdout and "wrote 48 MiB" in filled.stdout
        assert "wrote 192 MiB" in repo.stdout, repo  # 1 GiB of tmpfs asked for, 256 MiB given
        assert "192 MB /work + 64 MB /dev/shm" in repo.isolation, repo
        assert refused.status == "not_run" and refused.stdout == "", refused
        assert "memory limit 100 MB cannot hold a run without a writable cgroup" in refused.reason
        assert ours.stdout.split("\n")[:-1] == [
            "program 64 170",
            "pid 1 24",
            "program refused 80",
            "prlimit refused 1",  # EPERM (seccomp), for the program
            "prlimit refused 1",  # and for pid 1
            "child allocated 120",
        ], ours
        own = "24 MB (pid 1) + 64 MB (our program) + 170 MB address space per process x 4 others"
        assert f"memory bound for the whole sandbox 1024 MB <= memory limit 1024 MB: {own}" in ours.isolation
    finally:
        driver.stdin.close()
        driver.wait(timeout=30)


guard_box_tests(globals())
