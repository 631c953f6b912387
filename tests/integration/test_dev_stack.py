"""`fleet dev` (what `make dev` runs): stack up, a run launched as the UI does, all down on Ctrl-C."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import deliberation_partitions, deliberation_run_config

pytestmark = pytest.mark.integration


def test_fleet_dev_serves_the_ui_runs_a_launchpad_run_and_stops_everything(tmp_path: Path):
    with stack.fleet_dev(tmp_path, max_tokens=64) as dev:
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
