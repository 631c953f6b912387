"""Nothing left running however `fleet dev` (what `make dev` runs), or the load benchmark that
starts one, is stopped. Its whole stack serving the UI's launchpad, the CLI and the README, then
stopped with Ctrl-C, is tests/integration/test_first_hour.py (one stack for both)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fleet_pipelines import stack
from fleet_pipelines.cli import REPO_ROOT

from .processes import MARK, left_after, marked


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_fleet_dev_stopped_by_a_signal_while_it_starts_leaves_no_process(tmp_path: Path, signum: int):
    """Stopped once NATS, the model server and the Ray head are up, while Dagster starts (Ctrl-C
    on the whole stack: test_first_hour.py); with SIGHUP (a closed terminal), nobody reads its
    output any more either."""
    mark = uuid.uuid4().hex
    ports = {name: stack.free_port() for name in ("ui", "model", "ray", "nats")}
    dev = stack.start_fleet_dev(tmp_path, ports, max_tokens=16, env={MARK: mark})
    try:
        stack.read_until(dev, "ray head:", 180)
        if signum == signal.SIGHUP:
            dev.stdout.close()  # what it prints while stopping goes to a closed pipe
        os.kill(dev.pid, signum)
        assert dev.wait(120) == 0
    finally:
        if dev.poll() is None:
            dev.kill()
    assert left_after(mark) == []
    assert not (tmp_path / ".fleet" / "stack.json").exists()


PARENT = """
import json, sys, time
from pathlib import Path
from fleet_pipelines import stack
dev = stack.start_fleet_dev(Path(sys.argv[1]), json.loads(sys.argv[2]), 16)
stack.read_until(dev, "ray head:", 240)
print("up", flush=True)
time.sleep(3600)
"""


def test_fleet_dev_whose_parent_dies_stops_its_whole_stack(tmp_path: Path):
    """Its parent (which read its output) is killed with SIGKILL, telling nobody, while the stack
    starts: `fleet dev`, its output now a pipe nobody reads, stops every part of it."""
    mark = uuid.uuid4().hex
    ports = {name: stack.free_port() for name in ("ui", "model", "ray", "nats")}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path), json.dumps(ports)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), MARK: mark},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stack.read_until(parent, "up", 300)
        assert stack.port_open("127.0.0.1", ports["nats"]) and stack.port_open("127.0.0.1", ports["ray"])
        parent.kill()
        parent.wait()
        assert left_after(mark) == []
    finally:
        if parent.poll() is None:
            parent.kill()
    for port in ports.values():
        assert not stack.port_open("127.0.0.1", port)
    assert not (tmp_path / ".fleet" / "stack.json").exists()


def test_the_load_benchmark_killed_mid_run_leaves_no_process():
    """`timeout`'s SIGTERM once it has its engine up and `fleet dev` is starting its stack: its
    engine, its recorder and every part of `fleet dev`'s stack stop."""
    mark = uuid.uuid4().hex
    env = {
        k: v for k, v in os.environ.items() if k not in (*stack.STACK_ENV, "FLEET_STATE_DIR", "DAGSTER_HOME")
    }
    env |= {MARK: mark, "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, str(REPO_ROOT / "benchmarks" / "load.py"), "--concurrent", "1", "--agents", "2"]
    argv += ["--max-tokens", "16"]
    bench = subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        stack.read_until(bench, "starting fleet dev", 300)
        deadline = time.monotonic() + 240
        while not any("ray" in process and "--head" in process for process in marked(mark)):
            assert time.monotonic() < deadline and bench.poll() is None, "fleet dev's Ray head never started"
            time.sleep(0.5)
        os.kill(bench.pid, signal.SIGTERM)
        bench.wait(150)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert left_after(mark) == []
