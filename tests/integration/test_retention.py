"""Retention end to end on a real instance: two real deliberations (llama.cpp, Ray), the decision
log built for the first, the retention job run with an age both have passed: only the logged one
leaves (partition and files), its decision is in the log, and `fleet result` still answers for it
from the log; after the next log build the second goes too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from fleet_pipelines.assets.decision_log import decision_log
from fleet_pipelines.assets.deliberation import (
    STORED_ASSETS,
    deliberation_partitions,
    deliberation_run_config,
)
from fleet_pipelines.cli import REPO_ROOT
from fleet_pipelines.definitions import defs
from fleet_pipelines.history.log import DECISION_KEY, day_of
from fleet_pipelines.resources.history import HistoryResource
from fleet_pipelines.schedules.retention import retention_job

TASK = {"description": "Write a Python function add(a, b).", "role": "DEV", "num_agents": 2, "rounds": 0}


def fleet_result(home: Path, task_id: str) -> dict:
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-m", "fleet_pipelines.cli", "result", task_id, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def deliberate(instance: dg.DagsterInstance, resources: dict, task_id: str) -> dg.ExecuteInProcessResult:
    """What the daemon does for a planned task: add the partition, run deliberation_job on it."""
    instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
    result = defs.resolve_job_def("deliberation_job").execute_in_process(
        run_config=deliberation_run_config(TASK),
        instance=instance,
        partition_key=task_id,
        resources=resources,
    )
    assert result.success
    return result


def build_log(instance: dg.DagsterInstance, resources: dict, day: str) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [decision_log],
        partition_key=day,
        instance=instance,
        resources={k: resources[k] for k in ("frames_io_manager", "history")},
    )


def expire(instance: dg.DagsterInstance, resources: dict) -> dict:
    """The retention job with an age every deliberation so far has passed; its output metadata."""
    history = HistoryResource(base_path=resources["history"].base_path, max_age_seconds=0.001)
    result = retention_job.execute_in_process(instance=instance, resources={"history": history})
    assert result.success
    [output] = [e for e in result.all_node_events if e.event_type == dg.DagsterEventType.STEP_OUTPUT]
    return {k: v.value for k, v in output.step_output_data.metadata.items()}


@pytest.mark.heavy(39)
def test_retention_removes_logged_deliberations_and_result_still_answers(stack_env, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    storage = Path(os.environ["FLEET_STORAGE_PATH"])  # where stack_env's IO manager writes
    with dg.DagsterInstance.from_config(str(home)) as instance:
        first = deliberate(instance, stack_env, "ret-add-1")
        decided = first.output_for_node("decision")
        day = day_of(instance.get_latest_materialization_event(DECISION_KEY).timestamp)
        logged = build_log(instance, stack_env, day).output_for_node("decision_log")
        row = logged[logged["task_id"] == "ret-add-1"].iloc[0]
        assert row["run_id"] == first.run_id and row["status"] == decided.status.value
        assert row["winner_id"] == decided.winner_id and row["role"] == "DEV"
        assert row["tokens_out"] > 0 and row["turns"] == 2 and row["duration_s"] > 0
        assert json.loads(row["scores"]) == [r.model_dump() for r in decided.ranking]
        assert row["winner_content"] == decided.winner_content

        second = deliberate(instance, stack_env, "ret-add-2")  # not in the log yet

        report = expire(instance, stack_env)
        assert report["removed"] == 1 and report["not_logged"] == 1
        assert report["files_removed"] == len(STORED_ASSETS)
        assert not instance.has_dynamic_partition(deliberation_partitions.name, "ret-add-1")
        assert instance.has_dynamic_partition(deliberation_partitions.name, "ret-add-2")
        assert not list(storage.glob("*/ret-add-1.json"))
        assert len(list(storage.glob("*/ret-add-2.json"))) == len(STORED_ASSETS)

        old = fleet_result(home, "ret-add-1")
        assert old["source"] == "decision_log" and old["status"] == decided.status.value
        assert old["run_id"] == first.run_id and old["winner_id"] == decided.winner_id
        assert old["ranking"] == [r.model_dump() for r in decided.ranking]
        assert old["winner_content"] == decided.winner_content
        live = fleet_result(home, "ret-add-2")
        assert live["source"] == "live" and live["run_id"] == second.run_id

        day2 = day_of(instance.get_latest_materialization_event(DECISION_KEY).timestamp)
        build_log(instance, stack_env, day2)
        report = expire(instance, stack_env)
        assert report["removed"] == 1 and report["not_logged"] == 0
        assert not instance.has_dynamic_partition(deliberation_partitions.name, "ret-add-2")
        assert fleet_result(home, "ret-add-2")["source"] == "decision_log"
