"""Which processes a test started, found by a mark in their environment: every process started
with `MARK`=value in its environment passes it on to what it starts (Ray's workers and Dagster's
runs included), so none is missed however far down it was started."""

from __future__ import annotations

import time
from pathlib import Path

MARK = "FLEET_TEST_PROCESS_MARK"


def marked(mark: str) -> list[str]:
    """The live processes carrying `MARK`=`mark` in their environment (zombies have none)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"{MARK}={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append(f"{proc.name}: {(proc / 'cmdline').read_bytes()[:160]!r}")
        except OSError:  # gone meanwhile, or a kernel thread
            continue
    return found


def left_after(mark: str, timeout_s: float = 120) -> list[str]:
    """What still carries the mark once its stack had `timeout_s` to stop (each part may take
    its 20 s stop timeout); [] as soon as nothing does."""
    deadline = time.monotonic() + timeout_s
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(1)
    return left
