"""Deliberation speed on the local stack: parallel agents vs sequential turns, and where a run's
time goes (LLM, Ray dispatch, scoring, Dagster).

Starts its own llama.cpp server (3 slots) and Ray head on free ports, runs everything in one
process, and prints ratios measured in the same run (the machine is shared and noisy).

    .venv/bin/python benchmarks/deliberation.py [--max-tokens 160] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import dagster as dg

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import materialize_deliberation
from fleet_pipelines.dispatch.admission import execute_turn, make_engine
from fleet_pipelines.domain.councils import CouncilSettings, build_council
from fleet_pipelines.domain.deliberation import proposal_requests
from fleet_pipelines.domain.models import Role, Task

DESCRIPTION = "Write a Python function merge_intervals(intervals) that merges overlapping intervals."


def run_pipeline(
    resources: dict, instance: dg.DagsterInstance, task_id: str, agents: int
) -> dict[str, float]:
    """Seconds of a 0-round deliberation: the run, each step, and the proposals' LLM critical path."""
    config = {"description": DESCRIPTION, "role": "DEV", "num_agents": agents, "rounds": 0}
    start = time.perf_counter()
    result = materialize_deliberation(instance, resources, task_id, config)
    wall = time.perf_counter() - start
    assert result.success
    steps = {s.step_key: s.end_time - s.start_time for s in instance.get_run_step_stats(result.run_id)}
    proposals = result.output_for_node("proposals")
    return {
        "wall": wall,
        "steps": sum(steps.values()),
        "proposals_step": steps["proposals"],
        "llm_critical": max(p.latency_ms for p in proposals) / 1000,
        "scores_step": steps["scores"],
        "tokens": float(sum(p.tokens_out for p in proposals)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    model_port, ray_port = stack.free_port(), stack.free_port()
    model = stack.start_model_server(tmp / "logs", model_port, parallel=3)
    ray_token = stack.ray_auth_token(tmp)
    ray_head = stack.start_ray_head(tmp / "logs", ray_port, ray_token)
    os.environ.update(
        {
            "RAY_ADDRESS": f"127.0.0.1:{ray_port}",
            "RAY_AUTH_TOKEN_PATH": str(ray_token),
            "FLEET_LLM_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
            "FLEET_STORAGE_PATH": str(tmp / "storage"),
            "FLEET_MAX_TOKENS": str(args.max_tokens),
        }
    )
    from fleet_pipelines import wiring
    from fleet_pipelines.settings import FleetSettings

    resources = wiring.resources(FleetSettings.from_env())
    engine = resources["turn_runner"].engine.to_model()
    settings = CouncilSettings(max_tokens=args.max_tokens)
    task = Task(task_id="bench", description=DESCRIPTION, role=Role.DEV, num_agents=3, rounds=0)
    requests = proposal_requests(task, build_council(Role.DEV, 3, settings), settings)
    one: dict[str, list[float]] = defaultdict(list)
    three: dict[str, list[float]] = defaultdict(list)
    sequential: dict[str, list[float]] = defaultdict(list)
    try:
        with dg.instance_for_test(temp_dir=str(tmp)) as instance:
            run_pipeline(resources, instance, "warmup", 3)  # Ray connection, worker actors, model warm
            for i in range(args.repeats):
                for key, value in run_pipeline(resources, instance, f"one-{i}", 1).items():
                    one[key].append(value)
                for key, value in run_pipeline(resources, instance, f"three-{i}", 3).items():
                    three[key].append(value)
                start = time.perf_counter()
                turns = [asyncio.run(execute_turn(make_engine(engine), r)) for r in requests]
                sequential["wall"].append(time.perf_counter() - start)
                sequential["tokens"].append(float(sum(t.tokens_out for t in turns)))
    finally:
        ray_head.stop()
        model.stop()

    def med(series: dict[str, list[float]], key: str) -> float:
        return statistics.median(series[key])

    par_rate = med(three, "tokens") / med(three, "llm_critical")
    seq_rate = med(sequential, "tokens") / med(sequential, "wall")
    print(f"\nmax_tokens={args.max_tokens}, repeats={args.repeats}; medians in seconds")
    print(f"  1 agent, whole run                         {med(one, 'wall'):6.2f}")
    print(f"  3 agents in parallel, whole run            {med(three, 'wall'):6.2f}")
    print(f"    proposals step                           {med(three, 'proposals_step'):6.2f}")
    print(f"      LLM critical path (slowest turn)       {med(three, 'llm_critical'):6.2f}")
    dispatch = med(three, "proposals_step") - med(three, "llm_critical")
    print(f"      Ray dispatch (step - critical path)    {dispatch:6.2f}")
    print(f"    scores step (judge turns, sandbox, ruff) {med(three, 'scores_step'):6.2f}")
    print(f"    Dagster (run - sum of steps)             {med(three, 'wall') - med(three, 'steps'):6.2f}")
    print(f"  the same 3 turns one after another, no Ray {med(sequential, 'wall'):6.2f}")
    print(
        f"throughput: 3 parallel turns {par_rate:.0f} tok/s vs sequential {seq_rate:.0f} tok/s "
        f"(ratio {par_rate / seq_rate:.2f}x)"
    )
    print(
        f"ratio proposals step (3 parallel) / sequential turns: "
        f"{med(three, 'proposals_step') / med(sequential, 'wall'):.2f}x"
    )


if __name__ == "__main__":
    main()
