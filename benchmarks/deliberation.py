"""Deliberation speed on the local stack: parallel agents vs sequential turns, and orchestration overhead.

Starts its own llama.cpp server (3 slots) and Ray head on free ports, runs everything in one
process, and prints ratios measured in the same run (the machine is shared and noisy).

    .venv/bin/python benchmarks/deliberation.py [--max-tokens 160] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import dagster as dg

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import (
    materialize_deliberation,
)
from fleet_pipelines.dispatch.ray_dispatch import run_turn
from fleet_pipelines.domain.council import CouncilSettings, build_council
from fleet_pipelines.domain.deliberation import proposal_requests
from fleet_pipelines.domain.models import Role, Task

DESCRIPTION = "Write a Python function merge_intervals(intervals) that merges overlapping intervals."


def run_pipeline(
    resources: dict, instance: dg.DagsterInstance, task_id: str, agents: int
) -> tuple[float, float]:
    """Returns (run wall seconds, LLM critical path seconds) of a 0-round deliberation."""
    config = {"description": DESCRIPTION, "role": "DEV", "num_agents": agents, "rounds": 0}
    start = time.perf_counter()
    result = materialize_deliberation(instance, resources, task_id, config)
    wall = time.perf_counter() - start
    assert result.success
    critical_path = result.output_for_node("proposals")["latency_ms"].max() / 1000
    return wall, critical_path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    model_port, ray_port = stack.free_port(), stack.free_port()
    model = stack.start_model_server(tmp / "logs", model_port, parallel=3)
    ray_head = stack.start_ray_head(tmp / "logs", ray_port)
    os.environ.update(
        {
            "RAY_ADDRESS": f"127.0.0.1:{ray_port}",
            "FLEET_LLM_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
            "FLEET_STORAGE_PATH": str(tmp / "storage"),
            "FLEET_MAX_TOKENS": str(args.max_tokens),
        }
    )
    from fleet_pipelines.definitions import build_resources

    resources = build_resources()
    engine = resources["council"].llm.settings()
    settings = CouncilSettings(max_tokens=args.max_tokens)
    task = Task(task_id="bench", description=DESCRIPTION, role=Role.DEV, num_agents=3, rounds=0)
    requests = proposal_requests(task, build_council(Role.DEV, 3, settings), settings)
    try:
        with dg.instance_for_test(temp_dir=str(tmp)) as instance:
            run_pipeline(resources, instance, "warmup", 1)  # Ray connection, worker start, model warm
            rows: dict[str, list[float]] = {k: [] for k in ["one", "three", "seq", "crit3", "tok_seq"]}
            for i in range(args.repeats):
                wall1, _ = run_pipeline(resources, instance, f"one-{i}", 1)
                wall3, crit3 = run_pipeline(resources, instance, f"three-{i}", 3)
                start = time.perf_counter()
                sequential = [run_turn(engine, r) for r in requests]
                seq = time.perf_counter() - start
                rows["one"].append(wall1)
                rows["three"].append(wall3)
                rows["seq"].append(seq)
                rows["crit3"].append(crit3)
                rows["tok_seq"].append(sum(r.tokens_out for r in sequential) / seq)
            med = {k: statistics.median(v) for k, v in rows.items() if v}
    finally:
        ray_head.stop()
        model.stop()

    print(f"max_tokens={args.max_tokens} repeats={args.repeats} (medians, seconds)")
    print(f"  1 agent through the pipeline            {med['one']:.2f}")
    print(f"  3 agents in parallel through the pipeline {med['three']:.2f}")
    print(f"  the same 3 turns one after another       {med['seq']:.2f}  ({med['tok_seq']:.0f} tok/s)")
    print(f"  LLM critical path of the 3-agent run     {med['crit3']:.2f}")
    print(f"  orchestration overhead (run - critical)  {med['three'] - med['crit3']:.2f}")
    print(f"ratio sequential / parallel pipeline: {med['seq'] / med['three']:.2f}x")
    print(f"ratio 3-agent / 1-agent pipeline:     {med['three'] / med['one']:.2f}x")


if __name__ == "__main__":
    main()
