"""The sandbox against a hostile program trying to get out: capabilities, the host's files, its
sockets and processes, set-id bits, kernel knobs under /proc, pid 1 and the small channels between
sandboxes. Each attempt is blocked, in every identity of `sandbox_identities.box`."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from fleet_pipelines.domain.limits import SandboxLimits
from fleet_pipelines.sandbox import setup as sandbox_setup
from tests.integration.sandbox_identities import (
    REPO,
    Box,
    guard_box_tests,
    identity_box,  # noqa: F401 (the fixture `box`)
    python_call,
)

# --- it works, and says how it isolates ---


def test_a_program_runs_its_output_comes_back_and_the_isolation_is_named(box: Box):
    result = box.python("import sys\nprint('out')\nprint('err', file=sys.stderr)\n")
    assert (result.status, result.returncode) == ("passed", 0)
    assert result.stdout == "out\n" and result.stderr == "err\n"
    assert result.isolation.startswith("bwrap (all namespaces, allow-listed fs, pid 1 ours)")
    assert "limits: cgroup v1 (memory+swap, pids, cpu)" in result.isolation


def test_the_program_has_no_capability_and_cannot_regain_one(box: Box):
    program = textwrap.dedent(
        """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        def unshare():
            if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        lines = open("/proc/self/status").read().splitlines()
        status = dict(line.split(":\\t") for line in lines if ":\\t" in line)
        print(status["CapEff"].strip(), status["CapBnd"].strip(), status["NoNewPrivs"].strip())
        for attempt in (lambda: os.setuid(0), unshare):
            try:
                attempt()
                print("allowed")
            except OSError as exc:
                print("refused", exc.strerror)
        """
    )
    result = box.python(program)
    lines = result.stdout.splitlines()
    assert lines[0] == "0000000000000000 0000000000000000 1", result.stderr
    assert lines[1].startswith("refused") and "allowed" not in result.stdout
    assert result.status == "passed"


# --- the file system: only the interpreter, read-only, and the work dir ---


def test_nothing_of_the_host_is_readable(box: Box):
    targets = [
        REPO / "fleet_pipelines" / "__init__.py",
        REPO / "deploy" / "k8s" / "secrets.yaml",
        Path("/etc/passwd"),
        Path("/etc/hostname"),
        Path("/work/notes"),
        Path("/tmp"),
        Path.home() / ".bash_history",
        Path("/var/run/postgresql"),
        Path("/sys/fs/cgroup"),
    ]
    program = textwrap.dedent(
        f"""
        import os
        for path in {[str(t) for t in targets]!r}:
            print(path, os.path.exists(path))
        print(sorted(os.listdir("/")))
        """
    )
    result = box.python(program)
    assert result.status == "passed", result.stderr
    assert all(line.endswith(" False") for line in result.stdout.splitlines()[:-1]), result.stdout
    top = json.loads(result.stdout.splitlines()[-1].replace("'", '"'))
    assert set(top) <= {"dev", "proc", "work", "fleet", "usr", "lib", "lib64", "root", "opt"}


def test_writes_outside_the_work_dir_fail_and_the_work_dir_is_capped(box: Box):
    program = textwrap.dedent(
        """
        import os, sys
        blocked = 0
        beside_python = os.path.dirname(sys.executable) + "/x"
        for path in ["/escape.txt", "/usr/escape.txt", beside_python, "/fleet/init.py"]:
            try:
                open(path, "w").write("x")
            except OSError:
                blocked += 1
        open("inside.txt", "w").write("ok")
        try:
            with open("big", "wb") as f:
                for _ in range(64):
                    f.write(b"x" * (1 << 20))
            print("wrote 64 MiB")
        except OSError as exc:
            print("capped", exc.strerror)
        print("blocked", blocked)
        """
    )
    result = box.python(program, SandboxLimits(wall_s=8, cpu_s=3, max_file_mb=128, work_dir_mb=8))
    assert result.status == "passed", result.stderr
    assert "capped No space left on device" in result.stdout and "blocked 4" in result.stdout


def test_a_concurrent_sandbox_work_dir_is_out_of_reach(box: Box):
    name = f"hidden_test_{uuid.uuid4().hex}.py"
    holder = f"open({name!r}, 'w').write('secret')\nimport time\ntime.sleep(3)\n"
    seeker = textwrap.dedent(
        f"""
        import os, time
        time.sleep(1)
        found = [os.path.join(r, n) for r, _, names in os.walk("/") for n in names if n == {name!r}]
        print("found", found)
        """
    )
    holding, seeking = box.many([python_call(holder), python_call(seeker)])
    assert seeking.status == "passed", seeking.stderr
    assert seeking.stdout.strip() == "found []"
    assert holding.status == "passed"


# --- no network, no host socket of any kind ---


def test_tcp_udp_abstract_and_filesystem_sockets_of_the_host_are_unreachable(box: Box, tmp_path: Path):
    abstract = f"\0fleet-test-{uuid.uuid4().hex}"
    path = tmp_path / "open.sock"
    with (
        socket.socket() as tcp,
        socket.socket(socket.AF_UNIX) as unix_abs,
        socket.socket(socket.AF_UNIX) as unix_fs,
    ):
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        unix_abs.bind(abstract)
        unix_abs.listen()
        unix_fs.bind(str(path))
        unix_fs.listen()
        os.chmod(path, 0o777)
        tmp_path.chmod(0o755)
        program = textwrap.dedent(
            f"""
            import socket
            postgres = "/var/run/postgresql/.s.PGSQL.5432"
            attempts = {{
                "tcp": lambda: socket.create_connection(("127.0.0.1", {tcp.getsockname()[1]}), timeout=2),
                "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)),
                "abstract": lambda: socket.socket(socket.AF_UNIX).connect({abstract!r}),
                "unix": lambda: socket.socket(socket.AF_UNIX).connect({str(path)!r}),
                "postgres": lambda: socket.socket(socket.AF_UNIX).connect(postgres),
            }}
            for name, attempt in attempts.items():
                try:
                    attempt()
                    print(name, "connected")
                except OSError as exc:
                    print(name, "refused", exc.strerror)
            """
        )
        result = box.python(program)
    assert result.status == "passed", result.stderr
    assert [line.split()[1] for line in result.stdout.splitlines()] == ["refused"] * 5, result.stdout


# --- processes: signals, ptrace, /proc, setuid ---


def test_host_processes_are_invisible_and_unsignalable(box: Box, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FLEET_SECRET_FOR_TEST", "s3cret")
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        program = textwrap.dedent(
            f"""
            import ctypes, os, signal
            print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
            environ = b""
            for p in pids:
                try:
                    environ += open(f"/proc/{{p}}/environ", "rb").read()
                except PermissionError:  # pid 1, our non-dumpable init
                    pass
            print("secret", b"s3cret" in environ)
            for target in ({victim.pid}, 1):
                try:
                    os.kill(target, signal.SIGKILL if target != 1 else 0)
                    print("signalled", target)
                except OSError as exc:
                    print("kill refused", target, exc.strerror)
            libc = ctypes.CDLL(None, use_errno=True)
            print("ptrace", libc.ptrace(16, {victim.pid}, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
            try:
                os.kill(-1, signal.SIGKILL)  # everything it can reach: its own sandbox only
            except OSError:
                pass
            """
        )
        result = box.python(program)
        time.sleep(0.2)
        assert victim.poll() is None, "a host process was killed from the sandbox"
    finally:
        victim.kill()
        victim.wait()
    assert f"kill refused {victim.pid} No such process" in result.stdout
    assert "secret False" in result.stdout
    assert "ptrace -1 " in result.stdout  # refused (seccomp; the host pid does not exist there anyway)
    pids = json.loads(result.stdout.splitlines()[0].split(" ", 1)[1])
    assert max(pids) < 20  # its own pid namespace


def test_no_set_id_bit_can_take_effect(box: Box):
    """The only binaries are the interpreter and its libraries; every mount is nosuid anyway."""
    program = textwrap.dedent(
        """
        import os, stat
        paths = [os.path.join(r, n) for r, _, ns in os.walk("/") if not r.startswith("/proc") for n in ns]
        set_id = [p for p in paths if os.lstat(p).st_mode & (stat.S_ISUID | stat.S_ISGID)]
        mounts = [line.split() for line in open("/proc/self/mountinfo")]
        print(set_id, [m[4] for m in mounts if "nosuid" not in m[5].split(",")])
        """
    )
    result = box.python(program, SandboxLimits(wall_s=20, cpu_s=10))
    assert result.status == "passed", result.stderr
    assert result.stdout.strip() == "[] []"


def test_tracing_and_kernel_surface_syscalls_are_refused(box: Box):
    """ptrace (even PTRACE_TRACEME), process_vm_*, bpf, perf, userfaultfd, keyrings, io_uring,
    and prlimit64 on another process (its parent's limits): EPERM from the seccomp filter, while
    an ordinary syscall, and setting and reading one's own limits, work."""
    if platform.machine() not in sandbox_setup._DENIED_SYSCALLS:
        pytest.fail(f"no seccomp table for {platform.machine()}")
    numbers = sandbox_setup._DENIED_SYSCALLS[platform.machine()][1]
    program = textwrap.dedent(
        f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        for name, nr in {sorted(numbers.items())!r}:
            ctypes.set_errno(0)
            print(name, libc.syscall(nr, 0, 0, 0, 0, 0), ctypes.get_errno())
        print("getpid", libc.getpid() > 0)
        import resource, sys
        sys.stdout.flush()
        if os.fork() == 0:
            try:
                resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (64, 64))
                print("prlimit parent 0")
            except OSError as exc:
                print("prlimit parent", exc.errno)
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, 256))
            print("own", resource.prlimit(0, resource.RLIMIT_NOFILE), flush=True)
            os._exit(0)
        os.wait()
        """
    )
    result = box.python(program)
    assert result.status == "passed", result.stderr
    lines = result.stdout.splitlines()
    assert lines[:-3] == [f"{name} -1 1" for name in sorted(numbers)], result.stdout
    assert lines[-3:] == ["getpid True", "prlimit parent 1", "own (64, 256)"], result.stdout
    assert "; seccomp deny-list" in result.isolation


def test_no_write_reaches_the_kernel_knobs_under_proc(box: Box):
    """Every file under /proc/sys, and the other knobs of /proc, refuse a write; each run is an
    unprivileged uid of the host, never uid 0."""
    program = textwrap.dedent(
        """
        import os
        written, tried = [], 0
        paths = [os.path.join(r, n) for r, _, ns in os.walk("/proc/sys") for n in ns]
        paths += ["/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern", "/proc/sys/fs/lease-break-time"]
        for path in paths:
            tried += 1
            try:
                fd = os.open(path, os.O_WRONLY)
            except OSError:
                continue
            try:
                os.write(fd, open(path).read().encode() or b"0")
                written.append(path)
            except OSError:
                pass
            finally:
                os.close(fd)
        print(tried, written)
        """
    )
    before = Path("/proc/sys/fs/lease-break-time").read_text()
    result = box.python(program, SandboxLimits(wall_s=30, cpu_s=20))
    assert result.status == "passed", result
    tried, written = result.stdout.strip().split(" ", 1)
    assert int(tried) > 100 and written == "[]", result.stdout
    assert Path("/proc/sys/fs/lease-break-time").read_text() == before


def test_pid_1_is_out_of_reach_and_under_the_limits(box: Box):
    """In the harness pid 1 is the test process: its memory, fds and signals are out of the
    solution's reach. pid 1 runs under the same rlimits as every other process."""
    solution = textwrap.dedent(
        """
        import os, signal
        reached = []
        for path in ("/proc/1/mem", "/proc/1/fd/1", "/proc/1/environ"):
            try:
                open(path, "r+b").close()
                reached.append(path)
            except OSError:
                pass
        for how in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            os.kill(1, how)
        limits = open("/proc/1/limits").read()
        def report():
            size = [line.split()[3:5] for line in limits.splitlines() if line.startswith("Max file size")]
            return [os.getpid() != 1, reached, size]
        """
    )
    run = box.harness(solution, [("report()", "[True, [], [['16777216', '16777216']]]")])
    assert run.complete and run.outcomes[0]["passed"], run
    script = box.python(
        "import os\nreached = []\nfor how in (2, 15, 9, 19):\n    os.kill(1, how)\n"
        "for path in ('/proc/1/mem', '/proc/1/fd/1'):\n"
        "    try:\n        open(path, 'r+b').close()\n        reached.append(path)\n"
        "    except OSError:\n        pass\n"
        "limits = [ln for ln in open('/proc/1/limits') if ln.startswith('Max file size')]\n"
        "print(os.getpid() != 1, reached, limits[0].split()[3:5], flush=True)\n"
        "open('big', 'wb').write(b'x' * (32 << 20))\n"
    )
    assert script.stdout == "True [] ['16777216', '16777216']\n" and "File too large" in script.stderr, script


# --- what could pass between sandboxes or in from the caller ---


def test_small_channels_between_sandboxes_are_closed(box: Box):
    """flock/fcntl locks and leases on the shared read-only files, d/inotify on them, memfd_secret,
    AF_VSOCK and other socket families: refused. Plain TCP and unix sockets still work."""
    program = textwrap.dedent(
        """
        import ctypes, fcntl, os, socket, sys
        libc = ctypes.CDLL(None, use_errno=True)
        def attempt(name, call):
            try:
                call()
                print(name, "allowed")
            except OSError as exc:
                print(name, "refused")
        shared = open(sys.executable, "rb")
        attempt("flock", lambda: fcntl.flock(shared, fcntl.LOCK_SH | fcntl.LOCK_NB))
        attempt("lockf", lambda: fcntl.lockf(open("mine", "w"), fcntl.LOCK_EX | fcntl.LOCK_NB))
        attempt("ofd", lambda: fcntl.fcntl(shared, 37, bytes(32)))
        attempt("lease", lambda: fcntl.fcntl(shared, 1024, fcntl.F_RDLCK))
        directory = os.open(os.path.dirname(os.__file__), os.O_RDONLY)
        attempt("dnotify", lambda: fcntl.fcntl(directory, 1026, 0x80000001))  # DN_ACCESS | DN_MULTISHOT
        def syscall(nr):
            def call():
                if libc.syscall(nr, 0, 0, 0) < 0:
                    raise OSError(ctypes.get_errno(), "")
            return call
        attempt("inotify", syscall(294))
        attempt("memfd_secret", syscall(447))
        attempt("vsock", lambda: socket.socket(40, socket.SOCK_STREAM))
        attempt("packet", lambda: socket.socket(17, socket.SOCK_DGRAM))
        attempt("tcp", lambda: socket.socket().close())
        attempt("unix", lambda: socket.socketpair())
        """
    )
    if platform.machine() != "x86_64":
        pytest.fail("the syscall numbers of this test are x86_64's")
    result = box.python(program)
    assert result.status == "passed", result
    verdicts = dict(line.split() for line in result.stdout.splitlines())
    assert verdicts == {
        **dict.fromkeys(
            ["flock", "lockf", "ofd", "lease", "dnotify", "inotify", "memfd_secret", "vsock", "packet"],
            "refused",
        ),
        "tcp": "allowed",
        "unix": "allowed",
    }, verdicts


def test_the_environment_is_scrubbed(box: Box, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FLEET_SECRET_FOR_TEST", "s3cret")
    result = box.python("import os\nprint(sorted(os.environ.items()))")
    assert "FLEET_SECRET_FOR_TEST" not in result.stdout and "s3cret" not in result.stdout


guard_box_tests(globals())
