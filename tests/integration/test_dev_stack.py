"""`fleet dev` (what `make dev` runs): stack up, a run launched as the UI does, all down on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import deliberation_partitions, deliberation_run_config

pytestmark = pytest.mark.integration


def test_fleet_dev_serves_the_ui_runs_a_launchpad_run_and_stops_everything(tmp_path: Path):
    ui, model, ray, nats = stack.free_port(), stack.free_port(), stack.free_port(), stack.free_port()
    home = tmp_path / "home"
    env = {
        **os.environ,
        "FLEET_STATE_DIR": str(tmp_path / "state"),
        "DAGSTER_HOME": str(home),
        "FLEET_MAX_TOKENS": "64",
    }
    for name in ("FLEET_LLM_BASE_URL", "RAY_ADDRESS", "VLLM_URL", "NATS_URL"):
        env.pop(name, None)
    dev = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleet_pipelines.cli",
            "dev",
            "--port",
            str(ui),
            "--model-port",
            str(model),
            "--ray-port",
            str(ray),
            "--nats-port",
            str(nats),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        output = []
        while time.monotonic() < deadline:
            line = dev.stdout.readline()
            output.append(line)
            if "dagster UI:" in line or dev.poll() is not None:
                break
        assert f"http://127.0.0.1:{ui}" in "".join(output), "".join(output)

        # What a person does in the UI: add the partition, launch deliberation_job from the launchpad.
        instance = dg.DagsterInstance.from_config(str(home))
        instance.add_dynamic_partitions(deliberation_partitions.name, ["dev-smoke-1"])
        client = DagsterGraphQLClient("127.0.0.1", port_number=ui)
        config = {"description": "Write add(a, b) in Python.", "role": "DEV", "num_agents": 2, "rounds": 0}
        run_id = client.submit_job_execution(
            "deliberation_job",
            run_config=deliberation_run_config(config),
            tags={"dagster/partition": "dev-smoke-1"},
        )
        status = None
        while time.monotonic() < deadline + 180:
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
        event = instance.get_latest_materialization_event(dg.AssetKey("proposals"))
        assert "agent-dev-002" in event.asset_materialization.metadata["preview"].value

        # What the planning service does: an approved plan on NATS; the daemon's sensor starts the run.
        fleet_env = {**env, "NATS_URL": f"nats://127.0.0.1:{nats}"}
        fleet = [sys.executable, "-m", "fleet_pipelines.cli"]
        submitted = subprocess.run(
            [*fleet, "deliberate", "Write sub(a, b) in Python.", "--agents", "1", "--rounds", "0"],
            env=fleet_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert submitted.returncode == 0, submitted.stderr
        task_id = submitted.stdout.strip()
        result = subprocess.run(
            [*fleet, "result", task_id, "--wait", "240", "--json"],
            env=fleet_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert json.loads(result.stdout)["status"] == "COMPLETED"
    finally:
        os.killpg(dev.pid, signal.SIGINT)
        dev.wait(90)
    for port in (ui, model, ray, nats):
        assert not stack.port_open("127.0.0.1", port), f"port {port} still open after Ctrl-C"
