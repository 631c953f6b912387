"""The sandbox against escape attempts: each is blocked and reported, none passes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from fleet_pipelines.scoring import sandbox
from fleet_pipelines.scoring.sandbox import SandboxLimits, isolation_available, run_python

LIMITS = SandboxLimits(wall_s=8, cpu_s=2, memory_mb=256, max_processes=16)


@pytest.fixture(scope="module", autouse=True)
def needs_isolation():
    ok, why = isolation_available()
    assert ok, f"the sandbox must work on the CI machine: {why}"


def test_a_program_runs_and_its_output_comes_back():
    result = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)\n", LIMITS)
    assert (result.status, result.returncode) == ("passed", 0)
    assert result.stdout == "out\n" and result.stderr == "err\n"


def test_files_are_importable_and_a_failing_assert_fails():
    result = run_python(
        "from solution import f\nassert f() == 2\n", LIMITS, {"solution.py": "def f():\n    return 1\n"}
    )
    assert result.status == "failed" and result.returncode == 1
    assert "AssertionError" in result.stderr


def test_socket_to_a_listening_host_port_is_unreachable():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        program = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')"
        )
        result = run_python(program, LIMITS)
    assert result.status == "failed"
    assert "connected" not in result.stdout
    assert "Network is unreachable" in result.stderr


def test_writes_outside_the_work_dir_are_blocked(tmp_path: Path):
    targets = [tmp_path / "escape.txt", Path("/tmp") / f"fleet-escape-{os.getpid()}", Path.home() / "escape"]
    program = textwrap.dedent(
        f"""
        blocked = 0
        for path in {[str(t) for t in targets]!r}:
            try:
                open(path, "w").write("x")
            except OSError as exc:
                print("blocked", path, exc.strerror)
                blocked += 1
        open("inside.txt", "w").write("ok")  # the work dir itself is writable
        assert blocked == {len(targets)}
        """
    )
    result = run_python(program, LIMITS)
    assert result.status == "passed", result.stderr
    assert result.stdout.count("blocked") == len(targets)
    assert not any(t.exists() for t in targets)


def test_remounting_writable_is_refused():
    result = run_python(
        "import subprocess\nr = subprocess.run(['mount', '-o', 'remount,rw', '/'])\nassert r.returncode == 0",
        LIMITS,
    )
    assert result.status == "failed"


def test_a_fork_bomb_hits_the_process_limit():
    result = run_python("import os\nwhile True:\n    os.fork()\n", LIMITS)
    assert result.status in ("failed", "timeout")
    assert result.status == "timeout" or "Resource temporarily unavailable" in result.stderr


def test_allocating_past_the_memory_limit_fails():
    result = run_python("x = bytearray(1024 * 1024 * 1024)\nprint('allocated')", LIMITS)
    assert result.status == "failed" and "allocated" not in result.stdout
    assert "memory limit" in result.reason


def test_an_infinite_loop_hits_the_cpu_limit():
    result = run_python("while True:\n    pass\n", LIMITS)
    assert result.status == "timeout" and "CPU time limit" in result.reason


def test_a_sleeping_program_is_killed_at_the_wall_limit_with_its_children():
    program = "import subprocess, time\nsubprocess.Popen(['sleep', '300'])\ntime.sleep(300)\n"
    result = run_python(program, SandboxLimits(wall_s=2, cpu_s=2))
    assert result.status == "timeout" and "wall time limit" in result.reason
    leftover = subprocess.run(["pgrep", "-u", str(sandbox.NOBODY), "-f", "sleep 300"], capture_output=True)
    assert leftover.returncode == 1, leftover.stdout  # no process of the sandbox survives


def test_output_is_truncated_head_and_tail():
    result = run_python("print('A' * 50_000 + 'END')", SandboxLimits(max_output_chars=1_000))
    assert len(result.stdout) < 1_200 and result.stdout.startswith("A") and "END" in result.stdout
    assert "truncated" in result.stdout


def test_the_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FLEET_SECRET_FOR_TEST", "s3cret")
    result = run_python("import os\nprint(sorted(os.environ))", LIMITS)
    assert "FLEET_SECRET_FOR_TEST" not in result.stdout and "s3cret" not in result.stdout


def test_without_isolation_nothing_runs_and_nothing_passes(monkeypatch: pytest.MonkeyPatch):
    """unshare missing (as on a host without namespaces): the result is not_run, never a pass."""
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.isolation_available.cache_clear()
    try:
        result = run_python("print('should not run')", LIMITS)
    finally:
        monkeypatch.undo()
        sandbox.isolation_available.cache_clear()
    assert result.status == "not_run" and result.reason.startswith("no isolation")
    assert result.stdout == ""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_the_unprivileged_fallback_isolates_too():
    """Run by an unprivileged user (nobody), the sandbox uses a user namespace and still blocks."""
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    assert python, "a system python3 readable by nobody"
    repo = Path(__file__).resolve().parents[2]
    program = textwrap.dedent(
        """
        from fleet_pipelines.scoring.sandbox import run_python
        r = run_python("import socket\\nsocket.create_connection(('127.0.0.1', 9), timeout=2)")
        w = run_python("open('/tmp/fleet-userns-escape', 'w')")
        print(r.status, w.status, 'unreachable' in r.stderr, 'Read-only' in w.stderr)
        """
    )
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", program],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.stdout.split() == ["failed", "failed", "True", "True"], done.stderr[-2000:]
