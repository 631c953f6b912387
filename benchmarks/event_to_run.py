"""Event -> run latency under `fleet dev` (what `make dev` runs): approved plans published on NATS,
picked up by the daemon's planning sensor, queued, launched and finished.

Starts the whole local stack on free ports, publishes plans one by one (each a 1-agent, 0-round
task so the model is not the bottleneck), and prints the medians of: publish -> run created by
the sensor, -> run started, -> run finished; and the sensor's minimum interval for scale.

    .venv/bin/python benchmarks/event_to_run.py [--events 5]
"""

from __future__ import annotations

import argparse
import statistics
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
    created, started, finished = [], [], []
    with stack.fleet_dev(Path(tempfile.mkdtemp(prefix="fleet-e2r-")), max_tokens=32) as dev:
        time.sleep(10)  # the daemon's first sensor tick
        instance = dg.DagsterInstance.from_config(str(dev.dagster_home))
        publisher = NatsResource(url=dev.env["NATS_URL"])
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
    print(
        f"\n{args.events} events, one at a time (sensor minimum interval {MIN_INTERVAL_SECONDS} s); medians:"
    )
    print(f"  publish -> run created by the sensor  {statistics.median(created):6.2f} s")
    print(f"  publish -> run started                {statistics.median(started):6.2f} s")
    print(f"  publish -> run finished               {statistics.median(finished):6.2f} s")
    print(f"  max publish -> run started            {max(started):6.2f} s")


if __name__ == "__main__":
    main()
