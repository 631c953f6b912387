"""Repository tasks on the local stack, measured with the real model: per generated repository
(evaluation.repo_suite), the tool calls per tool turn (proposals and revisions), the share of calls
that parsed and ran, the share of final proposals whose patch applies and whose tests all pass
(the `patch_applies` and `tests` checks of the `scores` step), with the engine and sandbox time.

With `--projects`, the tasks are real projects instead (`evaluation.project_tasks`: pinned,
hash-checked PyPI sdists cached under .cache/sdists, a one-line bug put in that 1-3 of the
project's own tests catch), each run with every `--rounds` given; per task it also reports the
run's status and reasons, proposals completed, engine calls per turn, context errors, the largest
request's share of the engine's window, whether the buggy line reached the model (in the first
prompt or a tool result) per tool turn, final patches that apply, that touch the buggy function,
and whose tests all pass.

Starts its own llama.cpp server (`--parallel` slots, `--ctx` tokens each), Ray head and NATS
server on free ports; one deliberation per task, 2 agents, tools on. With `--json` each task's
figures are printed as one JSON line, and the last line is one JSON object of the totals.

    .venv/bin/python benchmarks/repo_deliberation.py [--max-tokens 256] [--cases 3] [--json]
    .venv/bin/python benchmarks/repo_deliberation.py --projects [--tasks six-b,...] [--rounds 0,1] --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import dagster as dg

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import materialize_deliberation
from fleet_pipelines.domain.decision import failure_cause
from fleet_pipelines.domain.models import TurnKind
from fleet_pipelines.domain.workspace import extract_patch
from fleet_pipelines.evaluation.project_tasks import (
    PROJECT_TASKS,
    ProjectTask,
    project_repo,
    project_task_fields,
    reached_model,
    touches_function,
)
from fleet_pipelines.evaluation.repo_suite import REPO_CASES, create_repo, repo_task_fields
from fleet_pipelines.llm.engine import engine_window
from fleet_pipelines.names import COUNCIL
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.resources.repos import ReposResource
from fleet_pipelines.workspace.checkout import make_writable

TOOL_KINDS = (TurnKind.PROPOSE, TurnKind.REVISE)


def share(part: int, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


def measure(result: dg.ExecuteInProcessResult) -> dict:
    """The counts of one deliberation: tool turns, calls, calls that parsed and ran, finals,
    finals whose patch applies, finals whose tests all pass."""
    turns = [*result.output_for_node("proposals"), *result.output_for_node("reviews")]
    tool_turns = [t for t in turns if t.kind in TOOL_KINDS]
    steps = [s for t in tool_turns for s in t.tool_steps]
    scores = result.output_for_node("scores")
    return {
        "turns": len(tool_turns),
        "calls": len(steps),
        "parsed_ran": sum(s.parsed and not s.output.startswith("error") for s in steps),
        "finals": len(scores),
        "applies": sum(s.value("patch_applies") == 1.0 for s in scores),
        "tests_passed": sum(s.value("tests") == 1.0 for s in scores),
        "not_applied": [
            f"{s.agent_id}: {s.check('patch_applies').evidence}"
            for s in scores
            if s.check("patch_applies") is not None and s.value("patch_applies") != 1.0
        ],
        "engine_s": sum(t.latency_ms for t in turns) / 1000,
        "tool_s": sum(t.tool_ms for t in turns) / 1000,
    }


def output(result: dg.ExecuteInProcessResult, node: str):
    """The step's output, or None when the step did not yield it."""
    try:
        return result.output_for_node(node)
    except (dg.DagsterInvariantViolationError, KeyError):
        return None


def measure_project(result: dg.ExecuteInProcessResult, task: ProjectTask, buggy: str, window: int) -> dict:
    """The figures of one deliberation on a real-project task (see the module's docstring)."""
    decision = output(result, "decision")  # a FAILED decision fails its blocking check, and the run
    council = output(result, COUNCIL)
    view = council.task.workspace_view if council else ""
    turns = [*(output(result, "proposals") or []), *(output(result, "reviews") or [])]
    tool_turns = [t for t in turns if t.kind in TOOL_KINDS]
    finals: dict[str, str] = {}
    for turn in tool_turns:  # the last usable version of each agent's proposal
        if turn.ok:
            finals[turn.agent_id] = extract_patch(turn.content)
    scores = {s.agent_id: s for s in output(result, "scores") or []}
    largest = max((getattr(t, "largest_prompt", 0) for t in turns), default=0)
    errors = [t.error or "" for t in turns if t.error]
    return {
        "status": decision.status.value if decision else "FAILED",
        "reasons": decision.reasons if decision else failure_cause(turns),
        "proposals_completed": sum(t.ok for t in turns if t.kind is TurnKind.PROPOSE),
        "tool_turns": len(tool_turns),
        "calls_per_turn": share(sum(t.engine_calls for t in tool_turns), len(tool_turns)),
        "context_errors": sum("context" in e.lower() for e in errors),
        "errors": sorted({e[:160] for e in errors}),
        "largest_request_share": share(largest, window) if largest else None,
        "buggy_reached_share": share(
            sum(reached_model(task, [view, *(s.output for s in t.tool_steps)]) for t in tool_turns),
            len(tool_turns),
        ),
        "finals": len(finals),
        "patches_apply": sum(
            scores[a].value("patch_applies") == 1.0 for a in finals if a in scores and finals[a]
        ),
        "patches_touch_function": sum(bool(p) and touches_function(p, task, buggy) for p in finals.values()),
        "patches_apply_and_touch": sum(
            bool(p)
            and touches_function(p, task, buggy)
            and a in scores
            and scores[a].value("patch_applies") == 1.0
            for a, p in finals.items()
        ),
        "tests_passed": sum(scores[a].value("tests") == 1.0 for a in finals if a in scores),
    }


def run_projects(args, instance, resources, tmp: Path, window: int) -> None:
    """One deliberation per real-project task and number of rounds; a JSON line each."""
    names = set(args.tasks.split(",")) if args.tasks else None
    tasks = [t for t in PROJECT_TASKS if names is None or t.name in names]
    rows = []
    for rounds in (int(r) for r in args.rounds.split(",")):
        for task in tasks:
            repo = project_repo(task, tmp / "repos" / f"{task.name}-{rounds}")
            buggy = (repo / task.path).read_text()
            fields = project_task_fields(task, repo, agents=2, rounds=rounds)
            start = time.perf_counter()
            result = materialize_deliberation(
                instance, resources, f"bench-{task.name}-{rounds}", fields, False
            )
            row = {"task": task.name, "rounds": rounds, "model": args.model_name, "window": window}
            row.update(measure_project(result, task, buggy, window))
            row["wall_s"] = round(time.perf_counter() - start, 1)
            rows.append(row)
            print(json.dumps(row) if args.json else row, flush=True)
    done = [r for r in rows if "tool_turns" in r]
    finals = sum(r["finals"] for r in done)
    totals = {
        "tasks": len(rows),
        "statuses": {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})},
        "context_errors": sum(r["context_errors"] for r in done),
        "buggy_reached_share": share(
            round(sum((r["buggy_reached_share"] or 0) * r["tool_turns"] for r in done)),
            sum(r["tool_turns"] for r in done),
        ),
        "finals": finals,
        "apply_and_touch_share": share(sum(r["patches_apply_and_touch"] for r in done), finals),
        "tests_passed_share": share(sum(r["tests_passed"] for r in done), finals),
        "largest_request_share": max((r["largest_request_share"] or 0 for r in done), default=None),
    }
    print(json.dumps(totals))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--cases", type=int, default=len(REPO_CASES))
    parser.add_argument("--json", action="store_true", help="End with one JSON object of the totals.")
    parser.add_argument("--protocol", choices=["json", "openai", "text"], default="json")
    parser.add_argument("--projects", action="store_true", help="Real-project tasks (PyPI sdists).")
    parser.add_argument("--tasks", default="", help="Real-project task names, comma-separated; default all.")
    parser.add_argument("--rounds", default="0", help="Review rounds of each real-project run, e.g. 0,1.")
    parser.add_argument("--parallel", type=int, default=3, help="The engine's slots.")
    parser.add_argument("--ctx", type=int, default=0, help="Tokens per slot; 0: the server's default.")
    args = parser.parse_args()
    args.model_name = "SmolLM2-135M-Instruct Q4_1"

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-repo-"))
    os.chmod(tmp, 0o755)
    model_port, ray_port, nats_port = stack.free_port(), stack.free_port(), stack.free_port()
    model = stack.start_model_server(
        tmp / "logs", model_port, parallel=args.parallel, ctx_per_slot=args.ctx or None
    )
    window = engine_window(f"http://127.0.0.1:{model_port}") or 0
    ray_token = stack.ray_auth_token(tmp)
    ray_head = stack.start_ray_head(tmp / "logs", ray_port, ray_token)
    nats = stack.start_nats(tmp / "logs", nats_port, tmp / "nats")
    os.environ.update(
        {
            "NATS_URL": f"nats://127.0.0.1:{nats_port}",
            "RAY_ADDRESS": f"127.0.0.1:{ray_port}",
            "RAY_AUTH_TOKEN_PATH": str(ray_token),
            "FLEET_LLM_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
            "FLEET_STORAGE_PATH": str(tmp / "storage"),
            "FLEET_MAX_TOKENS": str(args.max_tokens),
            "FLEET_TOOL_PROTOCOL": args.protocol,
        }
    )
    from fleet_pipelines import wiring
    from fleet_pipelines.settings import FleetSettings

    resources = wiring.resources(FleetSettings.from_env())
    council = CouncilResource(max_tokens=args.max_tokens)
    repos = ReposResource(root=str(tmp / "workspaces"))
    resources = {**resources, "council": council, "repos": repos}
    rows: list[tuple[str, str, dict, float]] = []
    try:
        (tmp / "home").mkdir()
        with dg.instance_for_test(temp_dir=str(tmp / "home")) as instance:
            if args.projects:
                run_projects(args, instance, resources, tmp, window)
                return
            for case in REPO_CASES[: args.cases]:
                fields = repo_task_fields(
                    case, create_repo(case, tmp / "repos" / case.name), agents=2, rounds=1
                )
                start = time.perf_counter()
                result = materialize_deliberation(instance, resources, f"bench-{case.name}", fields, False)
                wall = time.perf_counter() - start
                if not result.success:
                    rows.append((case.name, "FAILED RUN", {}, wall))
                    continue
                status = result.output_for_node("decision").status.value
                rows.append((case.name, status, measure(result), wall))
    finally:
        ray_head.stop()
        model.stop()
        nats.stop()
        make_writable(tmp)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nmax_tokens={args.max_tokens}; 2 agents, 1 round, tools on")
    header = (
        "case",
        "status",
        "calls/turn",
        "parsed+ran",
        "applies",
        "tests pass",
        "engine s",
        "tool s",
        "wall s",
    )
    print("  ".join(f"{h:>12}" for h in header))
    total = dict.fromkeys(("turns", "calls", "parsed_ran", "finals", "applies", "tests_passed"), 0)
    for name, status, m, wall in rows:
        for key in total:
            total[key] += m.get(key, 0)
        cells = (
            name,
            status,
            share(m.get("calls", 0), m.get("turns", 0)),
            share(m.get("parsed_ran", 0), m.get("calls", 0)),
            f"{m.get('applies', 0)}/{m.get('finals', 0)}",
            f"{m.get('tests_passed', 0)}/{m.get('finals', 0)}",
            round(m.get("engine_s", 0.0), 1),
            round(m.get("tool_s", 0.0), 1),
            round(wall, 1),
        )
        print("  ".join(f"{c!s:>12}" for c in cells))
        for why in m.get("not_applied", []):
            print(f"{'':>14}not applied: {why[:160]}")
    totals = {
        "cases": len(rows),
        "failed_runs": sum(status == "FAILED RUN" for _, status, _, _ in rows),
        "tool_turns": total["turns"],
        "tool_calls": total["calls"],
        "finals": total["finals"],
        "tool_calls_per_turn": share(total["calls"], total["turns"]),
        "calls_parsed_share": share(total["parsed_ran"], total["calls"]),
        "patch_applies_share": share(total["applies"], total["finals"]),
        "tests_passed_share": share(total["tests_passed"], total["finals"]),
    }
    if args.json:
        print(json.dumps(totals))


if __name__ == "__main__":
    main()
