"""Start-up: importing the code location, `fleet result` and `fleet --help`, each in a fresh process,
beside a bare `import dagster` measured in the same run (the floor every Dagster process pays).

    .venv/bin/python benchmarks/startup.py [--repeats 7] [--before DIR]

`fleet result` runs against a SQLite Dagster home and an unreachable NATS, so it measures the
command's own start-up and lookups, not a server: DECIDED_TASK is answered from the stored values
of its run; UNKNOWN_TASK (nothing knows it), PENDING_TASK (its partition added, no run yet) and
RUNNING_TASK (a started run) from the instance's tables (history/run_index.py).

`--before DIR` also runs each `fleet` case from another checkout's source (`git archive REV | tar
-x -C DIR`), interleaved with this one's, so a change is measured against what it replaces in
the same run, under the same load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import dagster as dg

from fleet_pipelines.domain.decision import Decision
from fleet_pipelines.domain.models import DeliberationStatus, Role, Task
from fleet_pipelines.history.stored import dump_value, stored_path
from fleet_pipelines.names import DELIBERATION_JOB, DELIBERATION_PARTITIONS, DELIBERATION_TASK, PARTITION_TAG

CASES = {
    "python -c 'import dagster'": [sys.executable, "-c", "import dagster"],
    "import fleet_pipelines.definitions": [sys.executable, "-c", "import fleet_pipelines.definitions"],
    "fleet result DECIDED_TASK": [sys.executable, "-m", "fleet_pipelines.cli", "result", "decided-task"],
    "fleet result UNKNOWN_TASK": [sys.executable, "-m", "fleet_pipelines.cli", "result", "no-such-task"],
    "fleet result PENDING_TASK": [sys.executable, "-m", "fleet_pipelines.cli", "result", "pending-task"],
    "fleet result RUNNING_TASK": [sys.executable, "-m", "fleet_pipelines.cli", "result", "running-task"],
    "fleet --help": [sys.executable, "-m", "fleet_pipelines.cli", "--help"],
}


def store_decided_task(storage: str) -> None:
    """A decided task as a run leaves it in storage: its task and its decision, one run id."""
    task = Task(task_id="decided-task", description="Write add(a, b).", role=Role.DEV, num_agents=2)
    decision = Decision(
        status=DeliberationStatus.COMPLETED,
        winner_id="agent-dev-001",
        ranking=[],
        reasons=["2 of 2 agents delivered"],
        quorum=2,
        usable_agents=2,
        failed_agents=[],
        timed_out_agents=[],
        winner_content="def add(a, b):\n    return a + b",
    )
    for asset, value in (("deliberation_task", task), ("decision", decision)):
        path = stored_path(storage, asset, task.task_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump_value(value, "run-1"))


def add_undecided_tasks(home: str, storage: str) -> None:
    """PENDING_TASK: its partition added, no run yet; RUNNING_TASK: a started run that stored its task."""
    with dg.DagsterInstance.from_config(home) as instance:
        instance.add_dynamic_partitions(DELIBERATION_PARTITIONS, ["pending-task", "running-task"])
        run = instance.add_run(
            dg.DagsterRun(job_name=DELIBERATION_JOB, run_id="run-2", tags={PARTITION_TAG: "running-task"})
        )
        start = dg.DagsterEvent(
            event_type_value=dg.DagsterEventType.RUN_START.value, job_name=DELIBERATION_JOB
        )
        instance.report_dagster_event(start, run.run_id)
    task = Task(task_id="running-task", description="Write add(a, b).", role=Role.DEV, num_agents=2)
    path = stored_path(storage, DELIBERATION_TASK, task.task_id)
    path.write_text(dump_value(task, run.run_id))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--before", help="another checkout's source: its `fleet` cases run too, interleaved")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="fleet-startup-")
    env = {
        **os.environ,
        "DAGSTER_HOME": root,
        "FLEET_STORAGE_PATH": f"{root}/storage",
        "NATS_URL": "nats://127.0.0.1:1",
    }
    store_decided_task(env["FLEET_STORAGE_PATH"])
    add_undecided_tasks(root, env["FLEET_STORAGE_PATH"])
    cases = [(name, argv, env, None) for name, argv in CASES.items()]
    if args.before:  # run from that directory: `python -m`/`-c` put it first on sys.path
        before = os.path.abspath(args.before)
        cases += [(f"{name} (before)", argv, env, before) for name, argv in CASES.items() if "fleet" in name]
    times: dict[str, list[float]] = {name: [] for name, *_ in cases}
    for _ in range(args.repeats):  # interleaved, so load on the machine hits every case alike
        for name, argv, case_env, cwd in cases:
            start = time.perf_counter()
            subprocess.run(argv, env=case_env, cwd=cwd, capture_output=True, check=False)
            times[name].append(time.perf_counter() - start)
    floor = statistics.median(times["python -c 'import dagster'"])
    print(f"\nmedians of {args.repeats} fresh processes (load average {os.getloadavg()[0]:.1f}):")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:38s} {median:5.2f} s  ({median / floor:.2f}x import dagster)")


if __name__ == "__main__":
    main()
