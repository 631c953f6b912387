"""Runs untrusted Python taken from proposals, isolated, or not at all.

What a run guarantees (Linux, util-linux `unshare`):
- **no network**: a fresh network namespace (only a loopback that is down), so no socket reaches
  the host, 127.0.0.1 included, or the outside;
- **no writes outside its temp dir**: a private mount namespace where every mount is read-only
  except the fresh work dir (see `sandbox_init.py`); the program runs as `nobody` with no
  capabilities and no_new_privs (when we are root), or as the mapped caller with an empty
  capability bounding set (unprivileged fallback: `unshare --map-root-user`), so it cannot
  remount anything writable;
- **bounded resources**: rlimits on CPU seconds, address space, processes, file size; a wall
  limit that kills the whole PID namespace, so no child outlives the run;
- **a scrubbed environment**: PATH, HOME/TMPDIR = the work dir, LANG; nothing of ours leaks in;
- **bounded output**: stdout/stderr go to files capped by the file-size limit and come back
  truncated to `max_output_chars` (head and tail kept).
Where the namespaces cannot be created, nothing runs: the result is "not_run", reason
"no isolation: ...", never a pass.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Literal

NOBODY = 65534
_INIT = Path(__file__).with_name("sandbox_init.py")
_ENV_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_file_mb: int = 16
    max_output_chars: int = 8_000


@dataclass(frozen=True)
class SandboxResult:
    status: Literal["passed", "failed", "timeout", "error", "not_run"]  # passed = exit code 0
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    reason: str


def _unshare_argv() -> list[str] | None:
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return None
    argv = [unshare, "--mount", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
    if os.geteuid() != 0:
        argv.insert(1, "--map-root-user")  # unprivileged: a user namespace owns the others
    return argv


@functools.cache
def isolation_available() -> tuple[bool, str]:
    """Whether sandboxed runs are possible here; probed once per process by a real run."""
    if _unshare_argv() is None:
        return False, "util-linux unshare not found (Linux namespaces needed)"
    probe = _run("import socket\nsocket.socket().close()\n", SandboxLimits(wall_s=20), {})
    if probe.status != "passed":
        return False, f"probe run failed: {probe.reason}: {probe.stderr[-300:]}"
    return True, ""


def run_python(
    source: str, limits: SandboxLimits = SandboxLimits(), files: dict[str, str] | None = None
) -> SandboxResult:
    """Runs `source` as main.py in a fresh work dir holding `files` (relative path -> text)."""
    ok, why = isolation_available()
    if not ok:
        return SandboxResult("not_run", None, "", "", 0.0, f"no isolation: {why}")
    return _run(source, limits, files or {})


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


def _write_files(work: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ValueError(f"sandbox file name must be relative and inside the work dir: {name!r}")
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _outcome(report: dict, returncode: int | None, limits: SandboxLimits, stderr: str) -> tuple[str, str]:
    """(status, reason) from what PID 1 reported."""
    if report.get("setup_error"):
        return "error", f"sandbox setup failed: {report['setup_error']}"
    sig = report.get("signal")
    if sig == "SIGXCPU" or (sig == "SIGKILL" and report.get("cpu_s", 0) >= limits.cpu_s):
        return "timeout", f"CPU time limit ({limits.cpu_s:g} s) exceeded"
    if sig == "SIGXFSZ":
        return "failed", f"file size limit ({limits.max_file_mb} MB) exceeded"
    if sig:
        return "failed", f"killed by {sig}"
    if returncode == 0:
        return "passed", "exit code 0"
    if "MemoryError" in stderr:
        return "failed", f"exit code {returncode}: memory limit ({limits.memory_mb} MB) reached"
    return "failed", f"exit code {returncode}"


def _run(source: str, limits: SandboxLimits, files: dict[str, str]) -> SandboxResult:
    argv = _unshare_argv()
    if argv is None:
        return SandboxResult("not_run", None, "", "", 0.0, "no isolation: unshare not available")
    as_root = os.geteuid() == 0
    work = Path(tempfile.mkdtemp(prefix="fleet-sandbox-"))
    status_r, status_w = os.pipe()
    start = time.monotonic()
    try:
        _write_files(work, {**files, "main.py": source})
        if as_root:
            for path in [work, *work.rglob("*")]:
                os.chown(path, NOBODY, NOBODY)
        python = Path(os.path.realpath(sys.executable))
        prefix = Path(sys.base_prefix).resolve()
        config = {
            "status_fd": status_w,
            "work": str(work),
            "python_prefix": str(prefix),
            "python_rel": str(python.relative_to(prefix)),
            "uid": NOBODY if as_root else None,
            "cpu_s": max(1, int(limits.cpu_s)),
            "memory_mb": limits.memory_mb,
            "max_processes": limits.max_processes,
            "max_file_mb": limits.max_file_mb,
            "env": {"PATH": _ENV_PATH, "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8"},
        }
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            process = subprocess.Popen(
                [*argv, str(python), "-I", "-S", str(_INIT), json.dumps(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(status_w,),
                start_new_session=True,
                env={"PATH": _ENV_PATH, "LANG": "C.UTF-8"},
                cwd=work,
            )
            os.close(status_w)
            status_w = -1
            timed_out = False
            try:
                process.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(process.pid, signal.SIGKILL)  # PID 1 dies -> the whole namespace dies
                process.wait()
            duration = time.monotonic() - start
            with os.fdopen(status_r, "rb") as status_file:
                status_r = -1
                lines = status_file.read().decode(errors="replace").splitlines()
            report = json.loads(lines[-1]) if lines else {}
            stdout = _read_truncated(out, limits.max_output_chars)
            stderr = _read_truncated(err, limits.max_output_chars)
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(work, ignore_errors=True)
    returncode = report.get("returncode")
    if timed_out:
        status, reason = "timeout", f"wall time limit ({limits.wall_s:g} s) exceeded; process tree killed"
    elif not report:
        status, reason = "error", f"sandbox exited with {process.returncode} without a report"
    else:
        status, reason = _outcome(report, returncode, limits, stderr)
    return SandboxResult(status, returncode, stdout, stderr, round(duration, 3), reason)
