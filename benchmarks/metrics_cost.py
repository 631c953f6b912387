"""What recording a turn's metrics costs the admission queue actor, inside a real Ray actor.

    .venv/bin/python benchmarks/metrics_cost.py [--turns N]

Starts a private local Ray, and in an actor records what `EngineQueue` records per turn
(`QueueMetrics`: admitted with its wait, ended with its status, service time and tokens, and the
gauges at each of the ~6 scheduler decisions a turn goes through), N times; prints the CPU time
per turn and, as a ratio, against the fastest turn the local engine serves (0.5 s: a judge's
verdict of a few tokens). Ray's metrics agent exports in the background, outside the actor.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import ray

from fleet_pipelines.dispatch.queue_metrics import QueueMetrics
from fleet_pipelines.domain.models import Role, TurnKind, TurnRequest, TurnResult, TurnStatus

FASTEST_TURN_S = 0.5
DECISIONS_PER_TURN = 6  # add, wait, grant, sent, ended, close: each sets the gauges


@ray.remote(num_cpus=0.05)
class Recorder:
    def __init__(self) -> None:
        self.metrics = QueueMetrics("http://127.0.0.1:8080/v1", "SmolLM2-135M-Instruct")

    def record(self, turns: int) -> float:
        request = TurnRequest(
            task_id="bench",
            agent_id="agent-dev-001",
            role=Role.DEV,
            kind=TurnKind.PROPOSE,
            round=0,
            messages=[],
            temperature=0.2,
            max_tokens=256,
        )
        result = TurnResult.for_request(
            request, TurnStatus.COMPLETED, content="x", tokens_in=300, tokens_out=120, latency_ms=4_000
        )
        start = time.process_time()
        for i in range(turns):
            for _ in range(DECISIONS_PER_TURN):
                self.metrics.state(3, i % 4, i % 3)
            self.metrics.admitted_turn(request.kind, 0.1)
            self.metrics.ended(result)
        return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=20_000)
    args = parser.parse_args()
    # A private Ray that writes no ~/.ray/auth_token (a first local ray.init() would, and Ray then
    # turns token authentication on for every head started on this machine).
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(
        address="local", num_cpus=1, include_dashboard=False, logging_level="WARNING", log_to_driver=False
    )
    try:
        recorder = Recorder.remote()
        ray.get(recorder.record.remote(100))  # warm
        cpu_s = ray.get(recorder.record.remote(args.turns))
    finally:
        ray.shutdown()
    per_turn_us = cpu_s / args.turns * 1e6
    print(
        json.dumps(
            {
                "turns": args.turns,
                "cpu_us_per_turn": round(per_turn_us, 1),
                "share_of_fastest_turn": round(per_turn_us / 1e6 / FASTEST_TURN_S, 6),
            }
        )
    )


if __name__ == "__main__":
    main()
