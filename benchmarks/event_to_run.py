"""Event -> run latency under `fleet dev` (what `make dev` runs): approved plans published on NATS,
picked up by the daemon's planning sensor, queued, launched and finished.

Starts the whole local stack on free ports, publishes plans one by one (each a 1-agent, 0-round
task so the model is not the bottleneck), and prints the medians of: publish -> run created by
the sensor, -> run started, -> run finished; and the sensor's minimum interval for scale.

    .venv/bin/python benchmarks/event_to_run.py [--events 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg

from fleet_pipelines import stack
from fleet_pipelines.events.planning import single_task_plan
from fleet_pipelines.events.streams import PLAN_APPROVED
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.sensors.planning import MIN_INTERVAL_SECONDS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-e2r-"))
    ui, model, ray, nats = (stack.free_port() for _ in range(4))
    env = {
        **os.environ,
        "FLEET_STATE_DIR": str(tmp / "state"),
        "DAGSTER_HOME": str(tmp / "home"),
        "FLEET_MAX_TOKENS": "32",
    }
    for name in ("FLEET_LLM_BASE_URL", "RAY_ADDRESS", "NATS_URL"):
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
    created, started, finished = [], [], []
    try:
        while "dagster UI:" not in (line := dev.stdout.readline()):
            if dev.poll() is not None or not line:
                raise SystemExit(f"fleet dev did not start: {line}")
        time.sleep(10)  # the daemon's first sensor tick
        instance = dg.DagsterInstance.from_config(str(tmp / "home"))
        publisher = NatsResource(url=f"nats://127.0.0.1:{nats}")
        for i in range(args.events):
            task_id = f"e2r-{i}"
            envelope = single_task_plan(
                task_id,
                {"description": "Write add(a, b).", "role": "DEV", "num_agents": 1, "rounds": 0},
                story_id="bench",
                plan_id=f"plan-{task_id}",
                approved_by="bench",
                idempotency_key=f"e2r-{i}",
            )
            sent = time.time()
            publisher.publish([(PLAN_APPROVED, envelope)])
            while True:
                runs = instance.get_runs(dg.RunsFilter(tags={"dagster/partition": task_id}))
                record = instance.get_run_record_by_id(runs[0].run_id) if runs else None
                if record and record.end_time:
                    created.append(record.create_timestamp.timestamp() - sent)
                    started.append(record.start_time - sent)
                    finished.append(record.end_time - sent)
                    break
                time.sleep(0.2)
    finally:
        os.killpg(dev.pid, signal.SIGINT)
        dev.wait(90)
    print(
        f"\n{args.events} events, one at a time (sensor minimum interval {MIN_INTERVAL_SECONDS} s); medians:"
    )
    print(f"  publish -> run created by the sensor  {statistics.median(created):6.2f} s")
    print(f"  publish -> run started                {statistics.median(started):6.2f} s")
    print(f"  publish -> run finished               {statistics.median(finished):6.2f} s")
    print(f"  max publish -> run started            {max(started):6.2f} s")


if __name__ == "__main__":
    main()
