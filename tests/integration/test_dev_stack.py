"""`fleet dev` (what `make dev` runs): stack up, a run launched as the UI does, all down on Ctrl-C;
nothing left running however it (or the load benchmark, which starts one) is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import deliberation_partitions, deliberation_run_config
from fleet_pipelines.cli import REPO_ROOT

pytestmark = pytest.mark.integration

MARK = "FLEET_TEST_PROCESS_MARK"  # every process started for a test here inherits it


def test_fleet_dev_serves_the_ui_runs_a_launchpad_run_and_stops_everything(tmp_path: Path):
    mark = uuid.uuid4().hex
    with stack.fleet_dev(tmp_path, max_tokens=64, env={MARK: mark}) as dev:
        ui = dev.ports["ui"]
        # What a person does in the UI: add the partition, launch deliberation_job from the launchpad.
        instance = dg.DagsterInstance.from_config(str(dev.dagster_home))
        instance.add_dynamic_partitions(deliberation_partitions.name, ["dev-smoke-1"])
        client = DagsterGraphQLClient("127.0.0.1", port_number=ui)
        config = {"description": "Write add(a, b) in Python.", "role": "DEV", "num_agents": 2, "rounds": 0}
        run_id = client.submit_job_execution(
            "deliberation_job",
            run_config=deliberation_run_config(config),
            tags={"dagster/partition": "dev-smoke-1"},
        )
        status = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                status = client.get_run_status(run_id)
            except DagsterGraphQLClientError:
                status = None
            if status in (
                dg.DagsterRunStatus.SUCCESS,
                dg.DagsterRunStatus.FAILURE,
                dg.DagsterRunStatus.CANCELED,
            ):
                break
            time.sleep(2)
        assert status == dg.DagsterRunStatus.SUCCESS
        # The launchpad's run carries the engine tag too: the run queue counts it against its engine.
        engine = urlparse(dev.env["FLEET_LLM_BASE_URL"]).netloc
        assert instance.get_run_by_id(run_id).tags["fleet/engine"] == engine
        event = instance.get_latest_materialization_event(dg.AssetKey("proposals"))
        assert "agent-dev-002" in event.asset_materialization.metadata["preview"].value

        # What the planning service does: an approved plan on NATS; the daemon's sensor starts the run.
        # The CLI runs as in a second shell in the stack's folder: a clean environment, nothing
        # passed from the stack but what it recorded in .fleet/stack.json.
        fleet = [sys.executable, "-m", "fleet_pipelines.cli"]
        clean = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
        submitted = subprocess.run(
            [*fleet, "deliberate", "Write sub(a, b) in Python.", "--agents", "1", "--rounds", "0"],
            cwd=dev.root,
            env=clean,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert submitted.returncode == 0, submitted.stderr
        task_id = submitted.stdout.strip()
        followed = subprocess.run(
            [*fleet, "result", task_id, "--follow", "--wait", "240"],
            cwd=dev.root,
            env=clean,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert followed.returncode == 0, followed.stdout + followed.stderr
        # Each turn as it finished, with its queue wait and service time, then the final status.
        lines = followed.stdout.splitlines()
        assert lines[0].startswith("agent-dev-001 propose r0: completed") and " queue " in lines[0]
        assert any(line.startswith("judge judge r0 -> agent-dev-001: completed") for line in lines)
        assert any(line.startswith(f"task {task_id}: COMPLETED (from ") for line in lines)
    assert left_after(mark) == []  # every part of the stack, the run's processes included
    for port in dev.ports.values():
        assert not stack.port_open("127.0.0.1", port), f"port {port} still open after Ctrl-C"
    # Stopped, the stack is forgotten: a command there now says how to start one, in one line.
    assert not (dev.root / ".fleet" / "stack.json").exists()
    orphan = subprocess.run(
        [*fleet, "deliberate", "Write mul(a, b) in Python."],
        cwd=dev.root,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert orphan.returncode == 1
    assert (
        orphan.stderr
        == "fleet deliberate: no NATS server chosen: start the local stack (make dev) or set NATS_URL\n"
    )


# -- nothing left running ----------------------------------------------------------------------


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
    """What still carries the mark once the stack had `timeout_s` to stop (each part may take
    its 20 s stop timeout); [] as soon as nothing does."""
    deadline = time.monotonic() + timeout_s
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_fleet_dev_stopped_by_a_signal_while_it_starts_leaves_no_process(tmp_path: Path, signum: int):
    """Stopped once NATS, the model server and the Ray head are up, while Dagster starts (Ctrl-C:
    the test above); with SIGHUP (a closed terminal), nobody reads its output any more either."""
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
