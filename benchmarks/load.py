"""K deliberations at once through the product, against the same engine requests replayed alone.

    .venv/bin/python benchmarks/load.py --concurrent K --agents N --rounds R [--max-tokens T] [--json]
        [--calls FILE]

Starts a llama.cpp engine of `make dev`'s kind (or uses the one at FLEET_LLM_BASE_URL), a recording
pass-through in front of it (benchmarks/same_work.py), and `fleet dev` (what `make dev` runs) on
free ports with the pass-through as its engine. Then:

1. the product: K approved plans published at once on NATS, as the planner does; the daemon's
   sensor and run queue start the runs (its limits are part of what is measured); every engine
   request of every run (proposals, critiques, revisions, judge turns) is recorded on its way;
2. the same work alone: the recorded requests sent again straight to a fresh engine of the same
   kind (the one it started is restarted: llama.cpp would restore the prompts it already served
   from memory), each the moment the requests it reads have finished, as many at once as the
   engine has slots, each decoding as many tokens as the product's reply did (same_work.py);
3. one JSON object as the last line: {"concurrent", "statuses", "failed_turns", "timed_out_turns",
   "goodput_same_work" (replay wall / product wall), "work_match" (replay completion tokens /
   the product's), "completion_tokens" and "work_digest" (the product's replies: runs with equal
   digests did the same work; the recorder seeds each request), "slot_occupancy",
   "by_kind" (per kind, time to first token and tokens per second of service, product and
   replay), "breakdown" (where the product's wall went with no request in the engine),
   "deliberation_wall_s" (median of the runs' start to end),
   "dagster_per_run" (medians: run start to its first engine request, the same less that
   request's wait in the admission queue, last request to run end), "wall_s", ...}.

`slot_occupancy` is the engine's slot-seconds in service (every request's service time, as the
pass-through saw it) over its slots x `wall_s`: how busy the product kept the engine.

`wall_s` runs from publishing the plans to the end of the last run, so the sensor interval, the
run queue and the runs' process starts count against the product, as a user would see them.
Both walls are measured in the same run on the same kind of engine: on a shared machine the ratio is
the figure to read, not the seconds. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import dagster as dg
from same_work import (
    Call,
    Recorder,
    busy_intervals,
    by_kind,
    idle_within,
    link_reads,
    replay,
)

from fleet_pipelines import stack
from fleet_pipelines.dispatch.admission import DEFAULT_SLOTS
from fleet_pipelines.events.planning import single_task_plan
from fleet_pipelines.events.streams import PLAN_APPROVED
from fleet_pipelines.history.status import finished_turns
from fleet_pipelines.llm.engine import llama_cpp_slots
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.settings import FleetSettings

DESCRIPTION = (
    "Write a function merge_intervals(intervals) that merges overlapping intervals given as a list "
    "of (start, end) pairs and returns them sorted by start."
)
REQUIREMENTS = ["handles empty input", "sorted output"]
TURN_LINE = re.compile(
    r"^turn \S+ (\w+) .*: (completed|failed|timeout), (\d+) tokens, queue ([\d.]+) s, service ([\d.]+) s"
)
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def product_timeout_s(k: int) -> float:
    """How long the product part may take before the benchmark gives up: the runs of one engine
    follow one another (the run queue's `fleet/engine` limit), each within its deadline, plus a
    run's start and end, the sensor and the queue."""
    return k * (FleetSettings.from_env().deliberation_timeout_s + 60) + 120


def run_product(dev: stack.DevStack, k: int, agents: int, rounds: int) -> dict:
    instance = dg.DagsterInstance.from_config(str(dev.dagster_home))
    # The same ids in every run (each run has a fresh Dagster instance and NATS): the prompts,
    # which carry them, are then the same, and so are the seeds of their requests (same_work.seeded).
    task_ids = [f"load-{i}" for i in range(k)]
    plans = [
        (
            PLAN_APPROVED,
            single_task_plan(
                task_id,
                {
                    # its id in the text: each engine request is told to its run (`breakdown`)
                    "description": f"{DESCRIPTION} (Ticket {task_id}.)",
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
    give_up = time.monotonic() + product_timeout_s(k)
    while len(runs) < k or any(
        instance.get_run_by_id(r.run_id).status not in FINISHED for r in runs.values()
    ):
        for task_id in task_ids:
            if task_id not in runs:
                found = instance.get_runs(dg.RunsFilter(tags={"dagster/partition": task_id}), limit=1)
                if found:
                    runs[task_id] = found[0]
        if time.monotonic() > give_up:
            raise TimeoutError(f"{k} deliberations not ended after {product_timeout_s(k):.0f} s: {runs}")
        time.sleep(2)
    records = {task_id: instance.get_run_record_by_id(r.run_id) for task_id, r in runs.items()}
    statuses: Counter[str] = Counter()
    turns: Counter[str] = Counter()
    first_queued: dict[str, float] = {}  # per task: how long its first proposal waited for the engine
    for task_id, run in runs.items():
        lines, _ = finished_turns(instance, run.run_id, None)
        for line in lines:
            match = TURN_LINE.search(line)
            turns[match.group(2)] += 1
            if match.group(1) == "propose":
                first_queued[task_id] = min(first_queued.get(task_id, math.inf), float(match.group(4)))
        statuses[decision_status(instance, run.run_id)] += 1
    return {
        "statuses": dict(statuses),
        "turns": sum(turns.values()),
        "first_queued": first_queued,
        "failed_turns": turns["failed"],
        "timed_out_turns": turns["timeout"],
        "published": started,
        # (created, started, ended, task id) of each run, time.time() values
        "runs": sorted(
            (r.create_timestamp.timestamp(), r.start_time, r.end_time, task_id)
            for task_id, r in records.items()
        ),
        "wall_s": max(r.end_time for r in records.values()) - started,
    }


def breakdown(product: dict, calls: list[Call]) -> tuple[dict[str, float], dict[str, float]]:
    """Where the product's wall went while no request was in the engine, and Dagster's cost per
    run (run start to its first engine request, its last to the run's end; medians). A call
    belongs to the run whose task id its prompt carries. Runs of one engine overlap (one holds
    the engine, one waits in reserve), so the idle categories of two runs may count the same
    idle second; `idle_engine_total` counts each once."""
    busy = busy_intervals(calls)
    out = {"sensor_and_queue": 0.0, "run_start": 0.0, "before_first_turn": 0.0, "between_phases": 0.0}
    out |= {"scoring": 0.0, "after_last_turn": 0.0, "between_runs": 0.0}
    to_first, to_asked, after_last = [], [], []
    first_created = min(created for created, _, _, _ in product["runs"])
    out["sensor_and_queue"] = idle_within(busy, product["published"], first_created)
    previous_end = None
    for created, started, ended, task_id in product["runs"]:
        mine = [c for c in calls if f"Ticket {task_id}." in json.dumps(c.body.get("messages", []))]
        out["run_start"] += idle_within(busy, created, started)
        if previous_end is not None and created > previous_end:
            out["between_runs"] += idle_within(busy, previous_end, created)
        previous_end = ended
        if not mine:
            continue
        first, last = min(c.sent for c in mine), max(c.ended or c.sent for c in mine)
        to_first.append(first - started)
        # less the wait of its first turn in the admission queue (a run in reserve waits there
        # for the engine): what the run's start and first steps cost
        to_asked.append(first - started - product["first_queued"].get(task_id, 0.0))
        after_last.append(ended - last)
        out["before_first_turn"] += idle_within(busy, started, first)
        out["after_last_turn"] += idle_within(busy, last, ended)
        judges = [c for c in mine if c.kind == "judge"]
        reviews_end = max((c.ended or c.sent for c in mine if c.kind != "judge"), default=first)
        scoring = idle_within(busy, reviews_end, min(c.sent for c in judges)) if judges else 0.0
        out["scoring"] += scoring
        out["between_phases"] += idle_within(busy, first, last) - scoring
    out["idle_engine_total"] = idle_within(
        busy, product["published"], product["published"] + product["wall_s"]
    )
    per_run = {
        "run_start_to_first_request_s": round(statistics.median(to_first), 2) if to_first else None,
        "run_start_to_first_turn_queued_s": round(statistics.median(to_asked), 2) if to_asked else None,
        "last_request_to_run_end_s": round(statistics.median(after_last), 2) if after_last else None,
    }
    return {k: round(v, 1) for k, v in out.items()}, per_run


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
    parser.add_argument(
        "--calls",
        type=Path,
        help="write the product's engine requests there, one JSON line each (body, reply), in the "
        "order they were sent: where two runs' work_digest differ, which requests did",
    )
    args = parser.parse_args()
    # Killed (Ctrl-C, `timeout`'s SIGTERM, a closed terminal), it stops every server it started on
    # the way out: its engines here, `fleet dev` (which stops its own stack) in `stack.fleet_dev`.
    stack.stop_on_signals()
    root = Path(tempfile.mkdtemp(prefix="fleet-load-"))
    engine_url = os.environ.get("FLEET_LLM_BASE_URL")
    fresh_replay_engine = engine_url is None
    engines: list[stack.Service] = []  # the engines this script started, each from its launch on
    recorder = None
    try:
        if fresh_replay_engine:  # the engine `fleet dev` would start, here to sit behind the recorder
            port = stack.free_port()
            stack.start_model_server(root / "engine-logs", port, parallel=3, into=engines)
            engine_url = f"http://127.0.0.1:{port}/v1"
        recorder = Recorder(engine_url)
        log(f"starting fleet dev under {root}, its engine {engine_url} through a recorder …")
        with stack.fleet_dev(root, args.max_tokens, engine_url=recorder.start()) as dev:
            log(f"{args.concurrent} deliberations …")
            product = run_product(dev, args.concurrent, args.agents, args.rounds)
            # Replayed while the stack is still up and idle (nothing else in the engine).
            calls = [c for c in recorder.calls if c.ended is not None]
            link_reads(calls)
            slots = llama_cpp_slots(engine_url) or DEFAULT_SLOTS
            if fresh_replay_engine:
                # A fresh engine of the same kind for the replay, as cold as the product found its
                # own: llama.cpp keeps the prompts it served in memory and restores a slot from
                # them, so the same requests sent again to the product's engine skipped their
                # prompts (judges 0.5 s to a first token against 18 s; flushing the slots did
                # not help).
                engines[-1].stop()  # (stopped again on the way out if a signal cut this short)
                engines.pop()
                port = stack.free_port()
                stack.start_model_server(root / "engine-logs-replay", port, parallel=3, into=engines)
                engine_url = f"http://127.0.0.1:{port}/v1"
            if args.calls:
                args.calls.write_text(
                    "".join(json.dumps({"body": c.body, "text": c.text}) + "\n" for c in calls)
                )
            log(f"replaying {len(calls)} engine requests at {slots} at once …")
            replayed, replay_wall = replay(engine_url, calls, slots)
    finally:
        stack.ignore_stop_signals()
        if recorder is not None:
            recorder.stop()
        for engine in engines:
            engine.stop()
    product_kinds, replay_kinds = by_kind(calls), by_kind(replayed)
    idle, per_run = breakdown(product, calls)
    summary = {
        "concurrent": args.concurrent,
        "agents": args.agents,
        "rounds": args.rounds,
        "statuses": product["statuses"],
        "turns": product["turns"],
        "failed_turns": product["failed_turns"],
        "timed_out_turns": product["timed_out_turns"],
        "goodput_same_work": round(replay_wall / product["wall_s"], 3),
        "slot_occupancy": round(sum(c.service_s for c in calls) / (slots * product["wall_s"]), 3),
        "replay_slot_occupancy": round(sum(c.service_s for c in replayed) / (slots * replay_wall), 3),
        # the replay's completion tokens over the product's: 1.0 is the same work (same_work.py)
        "work_match": round(
            sum(c.tokens_out for c in replayed) / max(1, sum(c.tokens_out for c in calls)), 3
        ),
        # the product's replies: equal digests are the same work (same_work.seeded)
        "completion_tokens": sum(c.tokens_out for c in calls),
        "work_digest": hashlib.sha256("\0".join(sorted(c.text for c in calls)).encode()).hexdigest()[:16],
        "engine_slots": slots,
        # False with FLEET_LLM_BASE_URL: the replay then ran on the engine the product warmed
        "replay_engine_fresh": fresh_replay_engine,
        "engine_requests": len(calls),
        "by_kind": {
            kind: {"product": product_kinds[kind], "replay": replay_kinds.get(kind)} for kind in product_kinds
        },
        "breakdown_idle_engine_s": idle,
        "dagster_per_run": per_run,
        "wall_s": round(product["wall_s"], 1),
        # a deliberation's wall: its run's start to its end (median over the K runs)
        "deliberation_wall_s": round(
            statistics.median(end - start for _, start, end, _ in product["runs"]), 1
        ),
        "replay_wall_s": round(replay_wall, 1),
        "load_average": round(os.getloadavg()[0], 1),
    }
    if not args.json:
        print(
            f"K={args.concurrent}, {args.agents} agents, {args.rounds} round(s): {summary['statuses']}, "
            f"{product['turns']} turns ({summary['failed_turns']} failed, {summary['timed_out_turns']} "
            f"timed out); product {product['wall_s']:.0f} s, the same {len(calls)} requests alone "
            f"{replay_wall:.0f} s: goodput_same_work {summary['goodput_same_work']:.2f}; {slots} slots "
            f"busy {summary['slot_occupancy']:.0%} of the time; engine idle: {idle}"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
