"""K deliberations at once through the product, against the engine alone doing their first phase.

    .venv/bin/python benchmarks/load.py --concurrent K --agents N --rounds R [--max-tokens T] [--json]

Starts `fleet dev` (what `make dev` runs) on free ports, with its own llama.cpp engine, or with the
engine at FLEET_LLM_BASE_URL when that is set. Then:

1. the yardstick: the K x N first-phase (proposal) requests of the deliberations, sent straight to
   the engine, all at once, streamed; completion tokens per second;
2. the product: K approved plans published at once on NATS, as the planner does; the daemon's
   sensor and run queue start the runs (its limits are part of what is measured); every turn of
   every run (proposals, critiques, revisions, judge turns) is read back from the run logs;
3. one JSON object as the last line: {"concurrent", "statuses", "failed_turns", "timed_out_turns",
   "goodput_ratio" (product tok/s / engine tok/s), "slot_occupancy", "wall_s", "engine_wall_s", ...}.

`slot_occupancy` is the engine's slot-seconds in service (every turn's service time) over its
capacity x `wall_s`: how busy the product kept the engine. It differs from `goodput_ratio` by
what a token costs: critiques, revisions and judge turns carry the proposals they read, so on a
CPU engine their prompts take seconds to process and their tokens come slower than the
yardstick's short proposal prompts (llama.cpp reports it as time to first token):
`slot_tok_s_by_kind` is each kind's tokens over its service seconds.

`wall_s` runs from publishing the plans to the end of the last run, so the sensor interval, the
run queue and the runs' process starts count against the product, as a user would see them.
Both rates are measured in the same run on the same engine: on a shared machine the ratio is
the figure to read, not the seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import dagster as dg

from fleet_pipelines import stack
from fleet_pipelines.dispatch.admission import DEFAULT_SLOTS
from fleet_pipelines.domain.council import CouncilSettings, build_council
from fleet_pipelines.domain.deliberation import proposal_requests
from fleet_pipelines.domain.models import Role, Task
from fleet_pipelines.events.planning import single_task_plan
from fleet_pipelines.events.streams import PLAN_APPROVED
from fleet_pipelines.history.results import finished_turns
from fleet_pipelines.llm.engine import ChatEngine, EngineSettings, llama_cpp_slots
from fleet_pipelines.llm.local_server import MODEL_NAME
from fleet_pipelines.resources.events import NatsResource

DESCRIPTION = (
    "Write a function merge_intervals(intervals) that merges overlapping intervals given as a list "
    "of (start, end) pairs and returns them sorted by start."
)
REQUIREMENTS = ["handles empty input", "sorted output"]
TURN_LINE = re.compile(
    r"^turn \S+ (\w+) .*: (completed|failed|timeout), (\d+) tokens, queue [\d.]+ s, service ([\d.]+) s"
)
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def yardstick(engine_url: str, k: int, agents: int, max_tokens: int | None) -> tuple[int, float]:
    """(completion tokens, wall seconds) of the K x N proposal requests sent at once."""
    settings = CouncilSettings(max_tokens=max_tokens)
    requests = [
        r
        for i in range(k)
        for r in proposal_requests(
            Task(task_id=f"yardstick-{i}", description=DESCRIPTION, role=Role.DEV, num_agents=agents),
            build_council(Role.DEV, agents, settings),
            settings,
        )
    ]
    # No admission here: the engine queues what its slots cannot take, so no first-token clock.
    engine = EngineSettings(
        base_url=engine_url, model=MODEL_NAME, first_token_timeout_s=3600, idle_timeout_s=600
    )

    async def all_at_once() -> list:
        chat = ChatEngine(engine)
        return await asyncio.gather(
            *(chat.stream(r.messages, r.temperature, r.max_tokens, r.stop) for r in requests)
        )

    start = time.perf_counter()
    done = asyncio.run(all_at_once())
    return sum(c.tokens_out for c in done), time.perf_counter() - start


def run_product(dev: stack.DevStack, k: int, agents: int, rounds: int) -> dict:
    instance = dg.DagsterInstance.from_config(str(dev.dagster_home))
    tag = f"{os.getpid()}-{int(time.time())}"
    task_ids = [f"load-{tag}-{i}" for i in range(k)]
    plans = [
        (
            PLAN_APPROVED,
            single_task_plan(
                task_id,
                {
                    "description": DESCRIPTION,
                    "role": "DEV",
                    "num_agents": agents,
                    "rounds": rounds,
                    "requirements": REQUIREMENTS,
                },
                story_id=task_id,  # independent stories: no earlier decision in the prompt
                plan_id=f"plan-{task_id}",
                approved_by="benchmark",
                idempotency_key=task_id,
            ),
        )
        for task_id in task_ids
    ]
    started = time.time()
    NatsResource(url=dev.env["NATS_URL"]).publish(plans)
    runs: dict[str, dg.DagsterRun] = {}
    while len(runs) < k or any(
        instance.get_run_by_id(r.run_id).status not in FINISHED for r in runs.values()
    ):
        for task_id in task_ids:
            if task_id not in runs:
                found = instance.get_runs(dg.RunsFilter(tags={"dagster/partition": task_id}), limit=1)
                if found:
                    runs[task_id] = found[0]
        time.sleep(2)
    ended = max(instance.get_run_record_by_id(r.run_id).end_time for r in runs.values())
    statuses: Counter[str] = Counter()
    turns: Counter[str] = Counter()
    tokens, service_s = 0, 0.0
    by_kind: dict[str, list[float]] = {}  # kind -> [tokens, service seconds]
    for run in runs.values():
        lines, _ = finished_turns(instance, run.run_id, None)
        for line in lines:
            kind, status, count, service = TURN_LINE.search(line).groups()
            by_kind.setdefault(kind, [0, 0.0])
            by_kind[kind][0] += int(count)
            by_kind[kind][1] += float(service)
            turns[status] += 1
            tokens += int(count)
            service_s += float(service)
        statuses[decision_status(instance, run.run_id)] += 1
    return {
        "statuses": dict(statuses),
        "turns": sum(turns.values()),
        "failed_turns": turns["failed"],
        "timed_out_turns": turns["timeout"],
        "tokens": tokens,
        "service_s": service_s,
        "slot_tok_s": {kind: round(n / s, 1) for kind, (n, s) in by_kind.items() if s},
        "wall_s": ended - started,
    }


def decision_status(instance: dg.DagsterInstance, run_id: str) -> str:
    """The decision's status from its materialization, or FAILED for a run that ended without one."""
    for event in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        materialization = event.dagster_event.step_materialization_data.materialization
        if materialization.asset_key == dg.AssetKey("decision"):
            return materialization.metadata["status"].value
    return "FAILED"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrent", type=int, required=True, help="K deliberations at once")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=None, help="cap every turn (default: the budgets)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line on stdout")
    args = parser.parse_args()
    # Started in the background, this process may have inherited SIGINT ignored; fleet dev would
    # inherit that too and not stop on the Ctrl-C the helper sends it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    engine_url = os.environ.get("FLEET_LLM_BASE_URL")
    root = Path(tempfile.mkdtemp(prefix="fleet-load-"))
    log(f"starting fleet dev under {root} …")
    with stack.fleet_dev(root, args.max_tokens, engine_url=engine_url) as dev:
        url = dev.env["FLEET_LLM_BASE_URL"]
        log(f"yardstick: {args.concurrent * args.agents} proposal requests straight to {url} …")
        engine_tokens, engine_wall = yardstick(url, args.concurrent, args.agents, args.max_tokens)
        log(f"  {engine_tokens} tokens in {engine_wall:.1f} s; now {args.concurrent} deliberations …")
        product = run_product(dev, args.concurrent, args.agents, args.rounds)
        # Reported before the stack stops: a slow stop on a loaded machine must not lose the figures.
        engine_rate = engine_tokens / engine_wall
        slots = llama_cpp_slots(url) or DEFAULT_SLOTS
        product_rate = product["tokens"] / product["wall_s"]
        summary = {
            "concurrent": args.concurrent,
            "agents": args.agents,
            "rounds": args.rounds,
            "statuses": product["statuses"],
            "turns": product["turns"],
            "failed_turns": product["failed_turns"],
            "timed_out_turns": product["timed_out_turns"],
            "goodput_ratio": round(product_rate / engine_rate, 3),
            "slot_occupancy": round(product["service_s"] / (slots * product["wall_s"]), 3),
            "engine_slots": slots,
            "slot_tok_s_by_kind": product["slot_tok_s"],
            "product_tok_s": round(product_rate, 1),
            "engine_tok_s": round(engine_rate, 1),
            "wall_s": round(product["wall_s"], 1),
            "engine_wall_s": round(engine_wall, 1),
        }
        if not args.json:
            print(
                f"K={args.concurrent}, {args.agents} agents, {args.rounds} round(s): {summary['statuses']}, "
                f"{product['turns']} turns ({summary['failed_turns']} failed, "
                f"{summary['timed_out_turns']} timed out); product {product_rate:.1f} tok/s over "
                f"{product['wall_s']:.0f} s, engine alone {engine_rate:.1f} tok/s over {engine_wall:.0f} s: "
                f"goodput ratio {summary['goodput_ratio']:.2f}; {slots} slots busy "
                f"{summary['slot_occupancy']:.0%} of the time"
            )
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
