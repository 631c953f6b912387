"""Run monitoring (issue 21): a launched run whose worker never comes up is marked failed after the
start timeout, and the run queue moves on. On a real local instance with the real `dagster-daemon`
(run queue, launcher, monitoring daemon), the run_monitoring section of deploy/dagster/dagster.yaml
with shorter times, and runs submitted with `dagster job launch`.

The one injected fault: the code location's module hangs while a run worker loads it, as long as a
flag file exists, so that run never reports it started (a run pod that is never scheduled, never
pulls its image, or is refused by admission looks the same to Dagster: STARTING, and no worker).
The local DefaultRunLauncher cannot resume runs, so max_resume_run_attempts is left out here (the
K8sRunLauncher of deploy/ can: tests/unit/test_deploy_dagster.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.events import DagsterEventType, RunFailureReason

from fleet_pipelines import stack

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20

CODE_LOCATION = """
import multiprocessing
import os
import time
from pathlib import Path

import dagster as dg

# Injected fault: a run worker (a child the code server spawns) that loads this module while the
# flag file exists hangs here, before the run can report that it started.
if multiprocessing.parent_process() is not None and Path(os.environ["STUCK_FLAG"]).exists():
    with open(os.environ["STUCK_PIDS"], "a") as pids:
        pids.write(f"{os.getpid()}\\n")
    time.sleep(300)


@dg.op
def step() -> int:
    return 1


@dg.job
def work():
    step()


defs = dg.Definitions(jobs=[work])
"""


def wait_until(what: str, condition: Callable[[], bool], timeout_s: float) -> float:
    """Polls `condition` until it holds; returns when (time.time())."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return time.time()
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s}s: {what}")


@pytest.mark.heavy(30)  # the stuck run is failed START_TIMEOUT_S after its launch
def test_a_run_that_never_starts_is_failed_and_the_queue_moves_on(tmp_path: Path):
    deployed = yaml.safe_load((REPO / "deploy" / "dagster" / "dagster.yaml").read_text())["run_monitoring"]
    assert deployed["enabled"] and deployed["start_timeout_seconds"] > START_TIMEOUT_S
    monitoring = {
        **{k: v for k, v in deployed.items() if k != "max_resume_run_attempts"},
        "start_timeout_seconds": START_TIMEOUT_S,
        "poll_interval_seconds": 1,
    }
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        yaml.safe_dump(
            {
                # One slot: while the stuck run holds it, nothing else may start.
                "run_queue": {"max_concurrent_runs": 1, "dequeue_interval_seconds": 1},
                "run_monitoring": monitoring,
                "telemetry": {"enabled": False},
            }
        )
    )
    (tmp_path / "monitored.py").write_text(CODE_LOCATION)
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        yaml.safe_dump(
            {"load_from": [{"python_file": {"relative_path": "monitored.py", "location_name": "m"}}]}
        )
    )
    flag, pids = tmp_path / "stuck", tmp_path / "stuck-pids"
    flag.touch()
    env = {**os.environ, "DAGSTER_HOME": str(home), "STUCK_FLAG": str(flag), "STUCK_PIDS": str(pids)}
    bin_dir = Path(sys.executable).parent

    def launch() -> None:
        command = [str(bin_dir / "dagster"), "job", "launch", "-w", str(workspace), "-j", "work"]
        subprocess.run(command, env=env, cwd=tmp_path, check=True, capture_output=True, timeout=180)

    instance = dg.DagsterInstance.from_config(str(home))
    daemon = stack.launch(
        "dagster-daemon",
        [str(bin_dir / "dagster-daemon"), "run", "-w", str(workspace)],
        tmp_path / "logs",
        env,
    )
    try:
        launch()
        (stuck,) = instance.get_runs()
        wait_until(
            "the first run launched, its worker hanging",
            lambda: (
                pids.exists() and instance.get_run_by_id(stuck.run_id).status == dg.DagsterRunStatus.STARTING
            ),
            120,
        )
        flag.unlink()  # runs launched from now on start normally
        launch()
        (queued,) = [r for r in instance.get_runs() if r.run_id != stuck.run_id]
        time.sleep(3)  # several dequeue intervals: the stuck run holds the only slot
        # Read in this order: the queued run may leave the queue only once the stuck run has
        # failed (a loaded machine can take START_TIMEOUT_S to get here: `dagster job launch`
        # loads the workspace), so whichever the moment, one of the two holds.
        queued_status = instance.get_run_by_id(queued.run_id).status
        stuck_status = instance.get_run_by_id(stuck.run_id).status
        assert queued_status == dg.DagsterRunStatus.QUEUED or stuck_status == dg.DagsterRunStatus.FAILURE, (
            queued_status,
            stuck_status,
        )

        failed_at = wait_until(
            "the stuck run marked failed",
            lambda: instance.get_run_by_id(stuck.run_id).status == dg.DagsterRunStatus.FAILURE,
            START_TIMEOUT_S + 60,
        )
        wait_until(
            "the queued run started and succeeded",
            lambda: instance.get_run_by_id(queued.run_id).status == dg.DagsterRunStatus.SUCCESS,
            180,
        )
    finally:
        daemon.stop()
        for pid in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)

    (failure,) = instance.all_logs(stuck.run_id, of_type=DagsterEventType.RUN_FAILURE)
    assert failure.dagster_event.event_specific_data.failure_reason == RunFailureReason.START_TIMEOUT
    assert f"longer than {START_TIMEOUT_S} seconds to start" in failure.message
    (started,) = instance.all_logs(queued.run_id, of_type=DagsterEventType.RUN_STARTING)
    assert failure.timestamp <= started.timestamp <= failed_at + 5  # the freed slot let it in
    stats = instance.get_run_stats(stuck.run_id)
    assert stats.launch_time is not None and stats.start_time is None  # it never started
