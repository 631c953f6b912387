"""Repository tasks on the local stack, measured with the real model: per generated repository
(evaluation.repo_suite), the tool calls per tool turn (proposals and revisions), the share of calls
that parsed and ran, the share of final proposals whose patch applies and whose tests all pass
(the `patch_applies` and `tests` checks of the `scores` step), with the engine and sandbox time.

Starts its own llama.cpp server (3 slots), Ray head and NATS server on free ports; one deliberation per
repository, 2 agents, 1 review round, tools on. With `--json` the last line is one JSON object of
the totals: tool_calls_per_turn, calls_parsed_share, patch_applies_share, tests_passed_share.

    .venv/bin/python benchmarks/repo_deliberation.py [--max-tokens 256] [--cases 3] [--json]
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
from fleet_pipelines.domain.models import TurnKind
from fleet_pipelines.evaluation.repo_suite import REPO_CASES, create_repo, repo_task_fields
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--cases", type=int, default=len(REPO_CASES))
    parser.add_argument("--json", action="store_true", help="End with one JSON object of the totals.")
    parser.add_argument("--protocol", choices=["json", "openai", "text"], default="json")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-repo-"))
    os.chmod(tmp, 0o755)
    model_port, ray_port, nats_port = stack.free_port(), stack.free_port(), stack.free_port()
    model = stack.start_model_server(tmp / "logs", model_port, parallel=3)
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
