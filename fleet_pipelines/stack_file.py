"""Where the running local stack listens: `fleet dev` records it in `<state dir>/stack.json`, and
every `fleet` command and Dagster entry point (through `FleetSettings.from_env`) reads it.

The record holds the environment variables the stack's own processes run with (`NATS_URL`,
`FLEET_LLM_BASE_URL`, `RAY_ADDRESS` and its head's `RAY_AUTH_TOKEN_PATH`, `DAGSTER_HOME`) and the
pid of `fleet dev`. A variable set in
the environment always wins over the record; a record whose `fleet dev` is gone is ignored, so a
command never connects to a server that nobody chose.

Light on purpose (standard library only): settings read it before anything else is imported.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

STACK_FILE = "stack.json"
# The variables the record may set, and the other names that keep its value out when set in the
# environment (an alias of the same thing, or what it belongs with: the head's token goes with the
# head's address, never with a cluster the environment names).
STACK_VARIABLES: dict[str, tuple[str, ...]] = {
    "NATS_URL": (),
    "FLEET_LLM_BASE_URL": ("VLLM_URL",),
    "RAY_ADDRESS": (),
    "RAY_AUTH_TOKEN_PATH": ("RAY_ADDRESS", "RAY_AUTH_TOKEN"),
    "DAGSTER_HOME": (),
}


def ray_auth_env(token: str | Path) -> dict[str, str]:
    """The variables under which Ray requires (a head) or presents (a client) the token file
    `token`. Ray reads them when it is imported (a process that imported it already:
    `resources.ray_cluster.present_ray_token`)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


def _start_ticks(pid: int) -> str | None:
    """When the process started (clock ticks since boot, /proc/PID/stat field 22): a pid that
    was reused by another process has another start."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


@dataclass(frozen=True)
class StackRecord:
    """A `fleet dev` that recorded itself: its pid and start, the UI's URL and its processes'
    variables."""

    path: Path
    pid: int
    started: str
    ui: str
    env: dict[str, str]
    metrics: dict[str, str]  # where each part serves Prometheus metrics: fleet, ray, engine

    @property
    def running(self) -> bool:
        return _start_ticks(self.pid) == self.started


def stack_path(state_dir: Path) -> Path:
    return state_dir.resolve() / STACK_FILE


def write_stack(state_dir: Path, ui: str, env: dict[str, str], metrics: dict[str, str] | None = None) -> Path:
    """Records this process as the running stack (atomically: a reader sees all of it or nothing);
    `metrics`: where its parts serve metrics, by name."""
    path = stack_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    body = {
        "pid": pid,
        "started": _start_ticks(pid),
        "ui": ui,
        "env": {k: v for k, v in env.items() if k in STACK_VARIABLES},
        "metrics": metrics or {},
    }
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(body, indent=2) + "\n")
    partial.replace(path)
    return path


def remove_stack(state_dir: Path) -> None:
    """Removes the record if this process wrote it."""
    record = read_stack(state_dir)
    if record is not None and record.pid == os.getpid():
        record.path.unlink(missing_ok=True)


def read_stack(state_dir: Path) -> StackRecord | None:
    """The record under `state_dir`, running or not; None when there is none or it cannot be read."""
    path = stack_path(state_dir)
    try:
        body = json.loads(path.read_text())
        return StackRecord(
            path=path,
            pid=int(body["pid"]),
            started=str(body["started"]),
            ui=str(body.get("ui", "")),
            env={str(k): str(v) for k, v in body["env"].items() if k in STACK_VARIABLES and v},
            metrics={str(k): str(v) for k, v in body.get("metrics", {}).items()},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def running_stack(state_dir: Path) -> StackRecord | None:
    """The record of a stack that is running now; None otherwise."""
    record = read_stack(state_dir)
    return record if record is not None and record.running else None


def with_stack(environ: dict[str, str], state_dir: Path) -> dict[str, str]:
    """`environ` with the running stack's variables added where neither the variable nor one of
    its aliases is set: an explicit variable always wins."""
    record = running_stack(state_dir)
    if record is None:
        return environ
    added = {
        name: value
        for name, value in record.env.items()
        if not any(environ.get(n) for n in (name, *STACK_VARIABLES[name]))
    }
    return {**added, **environ}
