"""NATS events: submit latency and the planning sensor's drain rate, on a private nats-server.

Prints (asserts nothing):
  - submit latency p50/p99 over 1,000 publishes of an approved plan, two ways: what `fleet deliberate`
    does after its process starts (connect + ensure streams + publish + ack), and acked publishes on
    one open connection;
  - 1,000 approved events drained by the planning sensor (ticks as the daemon runs them, partitions
    stored between ticks): seconds, ticks, runs requested, lost, duplicated.

Run: .venv/bin/python benchmarks/nats_events.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import dagster as dg

from fleet_pipelines import stack
from fleet_pipelines.definitions import defs
from fleet_pipelines.events.planning import single_task_plan
from fleet_pipelines.events.streams import PLAN_APPROVED
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.sensors.planning import MAX_EVENTS_PER_TICK, PLANNING_SENSOR

N = 1_000
TASK = {"description": "Write add(a, b).", "role": "DEV", "num_agents": 2, "rounds": 0}


def plan(i: int, prefix: str):
    return single_task_plan(
        f"{prefix}-{i}", TASK, "bench", f"plan-{prefix}-{i}", "bench", f"{prefix}-key-{i}"
    )


def percentiles(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=100)
    return f"p50 {q[49] * 1000:.2f} ms  p99 {q[98] * 1000:.2f} ms"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        port = stack.free_port()
        server = stack.start_nats(Path(tmp) / "logs", port, Path(tmp) / "store")
        try:
            nats = NatsResource(url=f"nats://127.0.0.1:{port}")
            nats.ensure_streams()

            submit = []
            for i in range(N):
                start = time.perf_counter()
                nats.publish([(PLAN_APPROVED, plan(i, "submit"))])
                submit.append(time.perf_counter() - start)

            async def open_connection(session) -> list[float]:
                samples = []
                for i in range(N):
                    envelope = plan(i, "drain")
                    start = time.perf_counter()
                    await session.publish(PLAN_APPROVED, envelope)
                    samples.append(time.perf_counter() - start)
                return samples

            acked = nats.session(open_connection)
            print(f"submit, connect+ensure+publish+ack ({N}): {percentiles(submit)}")
            print(f"submit, acked publish on an open connection ({N}): {percentiles(acked)}")
            print(f"ratio of medians: {statistics.median(submit) / statistics.median(acked):.1f}x")

            sensor = defs.get_sensor_def(PLANNING_SENSOR)
            with dg.instance_for_test(temp_dir=tmp) as instance:
                cursor, requests, ticks = None, [], 0
                start = time.perf_counter()
                while True:
                    context = dg.build_sensor_context(
                        instance_ref=instance.get_ref(),
                        cursor=cursor,
                        definitions=defs,
                        resources={"nats": nats},
                    )
                    data = sensor.evaluate_tick(context)
                    ticks += 1
                    if not data.run_requests:
                        break
                    for partitions in data.dynamic_partitions_requests:
                        instance.add_dynamic_partitions(
                            partitions.partitions_def_name, list(partitions.partition_keys)
                        )
                    requests.extend(data.run_requests)
                    cursor = data.cursor
                seconds = time.perf_counter() - start
            keys = [r.run_key for r in requests]
            expected = {f"{p}-key-{i}:{p}-{i}" for p in ("submit", "drain") for i in range(N)}
            print(
                f"drain {2 * N} approved events: {seconds:.2f} s in {ticks} ticks "
                f"(<= {MAX_EVENTS_PER_TICK} events each, last one empty), "
                f"{2 * N / seconds:.0f} events/s; runs requested {len(keys)}, "
                f"lost {len(expected - set(keys))}, duplicated {len(keys) - len(set(keys))}"
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
