"""Repository tasks on the local stack: per deliberation, the tool calls the agents made, the
engine time they cost and the sandbox time (workspace baseline, tool calls, patch scoring).

Starts its own llama.cpp server (3 slots), Ray head and NATS server on free ports; one deliberation per
generated repository (evaluation.repo_suite), 2 agents, 1 review round, tools on.

    .venv/bin/python benchmarks/repo_deliberation.py [--max-tokens 256] [--cases 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import dagster as dg

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import materialize_deliberation
from fleet_pipelines.evaluation.repo_suite import REPO_CASES, create_repo, repo_task_fields
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.resources.repos import ReposConfig
from fleet_pipelines.workspace.checkout import make_writable


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--cases", type=int, default=len(REPO_CASES))
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
        }
    )
    from fleet_pipelines import wiring
    from fleet_pipelines.settings import FleetSettings

    resources = wiring.resources(FleetSettings.from_env())
    council = CouncilResource(max_tokens=args.max_tokens, repos=ReposConfig(root=str(tmp / "workspaces")))
    resources = {**resources, "council": council}
    rows = []
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
                steps = {
                    s.step_key: s.end_time - s.start_time for s in instance.get_run_step_stats(result.run_id)
                }
                if not result.success:
                    rows.append((case.name, "FAILED RUN", 0, 0, 0.0, 0.0, 0.0, 0.0, wall))
                    continue
                turns = [*result.output_for_node("proposals"), *result.output_for_node("reviews")]
                decision = result.output_for_node("decision")
                rows.append(
                    (
                        case.name,
                        decision.status.value,
                        sum(len(t.tool_steps) for t in turns),
                        sum(t.engine_calls for t in turns),
                        sum(t.latency_ms for t in turns) / 1000,
                        sum(t.tool_ms for t in turns) / 1000,
                        steps.get("workspace", 0.0),
                        steps.get("scores", 0.0),
                        wall,
                    )
                )
    finally:
        ray_head.stop()
        model.stop()
        nats.stop()
        make_writable(tmp)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nmax_tokens={args.max_tokens}; 2 agents, 1 round, tools on; seconds")
    header = (
        "case",
        "status",
        "tool calls",
        "engine calls",
        "engine s",
        "tool sandbox s",
        "workspace s",
        "scores s",
        "wall s",
    )
    print("  ".join(f"{h:>14}" for h in header))
    for row in rows:
        print("  ".join(f"{v:>14.2f}" if isinstance(v, float) else f"{v!s:>14}" for v in row))


if __name__ == "__main__":
    main()
