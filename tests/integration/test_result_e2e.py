"""End to end: `fleet deliberate` -> planning sensor -> the real deliberation job (llama.cpp, Ray)
-> `orchestration.deliberation.completed` on JetStream -> `fleet result` COMPLETED with the winner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg

from fleet_pipelines.cli import REPO_ROOT
from fleet_pipelines.definitions import defs
from fleet_pipelines.events.streams import AGENT_RESPONSE_COMPLETED, DELIBERATION_COMPLETED
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.resources.repos import ReposResource
from fleet_pipelines.sensors.planning import PLANNING_SENSOR
from tests.factories import read_subject


def fleet(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleet_pipelines.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_deliberate_sensor_run_event_and_result(stack_env, nats_resource, ray_head, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "NATS_URL": nats_resource.url, "RAY_ADDRESS": ray_head}

    missing = fleet(env, "result", "no-such-task", "--json")
    assert missing.returncode == 3, missing.stderr[-2000:]
    assert json.loads(missing.stdout)["status"] == "NOT_FOUND"

    submitted = fleet(
        env,
        "deliberate",
        "Write a Python function add(a, b).",
        "--role",
        "dev",
        "--agents",
        "2",
        "--rounds",
        "0",
    )
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    task_id = submitted.stdout.strip()
    pending = fleet(env, "result", task_id, "--json")
    assert pending.returncode == 0 and json.loads(pending.stdout)["status"] == "PENDING", pending.stdout

    instance = dg.DagsterInstance.from_config(str(home))
    with dg.build_sensor_context(  # closed: see tests/integration/test_sensor_planning.py's tick()
        instance_ref=instance.get_ref(),
        definitions=defs,
        resources={"nats": nats_resource, "council": CouncilResource(), "repos": ReposResource()},
    ) as context:
        tick = defs.get_sensor_def(PLANNING_SENSOR).evaluate_tick(context)
    [request] = tick.run_requests
    assert request.partition_key == task_id and request.tags["fleet/role"] == "DEV"
    # What the daemon does with the tick: store the partitions, then launch the requested run
    # (here in process, with the test stack's resources).
    for partitions in tick.dynamic_partitions_requests:
        instance.add_dynamic_partitions(partitions.partitions_def_name, list(partitions.partition_keys))
    result = defs.resolve_job_def("deliberation_job").execute_in_process(
        run_config=request.run_config,
        instance=instance,
        partition_key=request.partition_key,
        tags=request.tags,
        resources=stack_env,
    )
    assert result.success

    [completed] = read_subject(nats_resource, "ORCHESTRATOR_EVENTS", DELIBERATION_COMPLETED)
    outcome = completed["payload"]
    assert outcome["task_id"] == task_id and outcome["run_id"] == result.run_id
    assert outcome["status"] == "COMPLETED" and outcome["winner_id"] in {"agent-dev-001", "agent-dev-002"}
    assert completed["correlation_id"] == task_id and completed["schema_version"] == 1
    responses = read_subject(nats_resource, "AGENT_RESPONSES", AGENT_RESPONSE_COMPLETED)
    assert sorted(r["payload"]["agent_id"] for r in responses) == ["agent-dev-001", "agent-dev-002"]
    assert all(r["payload"]["proposal"]["content"] for r in responses)
    # The old system's consumers: its workers' agent.results.{task_id}, its collector's summary.
    workers = read_subject(nats_resource, "AGENT_RESULTS", f"agent.results.{task_id}")
    assert sorted(w["agent_id"] for w in workers) == ["agent-dev-001", "agent-dev-002"]
    [collected] = read_subject(nats_resource, "DELIBERATION_RESULTS", "deliberation.completed")
    assert collected["task_id"] == task_id and collected["status"] == "completed"
    assert collected["total_agents"] == 2 and collected["successful_responses"] == 2

    env["FLEET_STORAGE_PATH"] = os.environ["FLEET_STORAGE_PATH"]  # where the IO manager wrote
    shown = fleet(env, "result", task_id, "--json", "--wait", "30")
    assert shown.returncode == 0, shown.stderr[-2000:]
    summary = json.loads(shown.stdout)
    assert summary["status"] == "COMPLETED" and summary["run_id"] == result.run_id
    assert summary["winner_id"] == outcome["winner_id"]
    assert [r["agent_id"] for r in summary["ranking"]] == [r["agent_id"] for r in outcome["ranking"]]
    assert summary["winner_content"]
