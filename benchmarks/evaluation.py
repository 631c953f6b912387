"""A real evaluation run: arms A-E on HumanEval through the evaluation asset, on the local stack.

Starts its own llama.cpp server (SmolLM2-135M) and Ray head on free ports unless
FLEET_LLM_BASE_URL / RAY_ADDRESS point at running ones, materialises the `evaluation` asset in a
temporary Dagster instance, and prints the report with per-arm pass@1, tokens and wall time, plus
ratios measured in this run (tokens and wall time of each arm relative to arm A). `--out DIR`
also writes the report, the plot and the per-(problem, arm) table there.

    .venv/bin/python benchmarks/evaluation.py --split dev --sample-size 0        # problems 0-39
    .venv/bin/python benchmarks/evaluation.py --split test --sample-size 20 --seed 1
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import dagster as dg

from fleet_pipelines import stack, wiring
from fleet_pipelines.assets.evaluation import evaluation
from fleet_pipelines.settings import FleetSettings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--suite", default="humaneval")
    parser.add_argument("--split", default="dev", choices=["dev", "test", "all"])
    parser.add_argument("--sample-size", type=int, default=0, help="0: the whole split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=2, help="problems at once")
    parser.add_argument("--slots", type=int, default=4, help="llama.cpp parallel slots (own server)")
    parser.add_argument("--partition", default=time.strftime("%Y-%m-%d"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    with ExitStack() as stop, tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        if not os.environ.get("FLEET_LLM_BASE_URL"):
            port = stack.free_port()
            stop.callback(stack.start_model_server(logs, port, parallel=args.slots).stop)
            os.environ["FLEET_LLM_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
        if not os.environ.get("RAY_ADDRESS"):
            port = stack.free_port()
            token = stack.ray_auth_token(Path(tmp))
            stop.callback(stack.start_ray_head(logs, port, token).stop)
            os.environ.update(RAY_ADDRESS=f"127.0.0.1:{port}", RAY_AUTH_TOKEN_PATH=str(token))
        os.environ["FLEET_STORAGE_PATH"] = str(Path(tmp) / "storage")
        config = {
            "suite": args.suite,
            "split": args.split,
            "sample_size": args.sample_size,
            "seed": args.seed,
            "num_agents": args.agents,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "max_concurrent_problems": args.concurrency,
        }
        start = time.perf_counter()
        with dg.instance_for_test(temp_dir=tmp) as instance:
            result = dg.materialize(
                [evaluation],
                resources=wiring.resources(FleetSettings.from_env()),
                instance=instance,
                partition_key=args.partition,
                run_config={"ops": {"evaluation": {"config": config}}},
            )
        elapsed = time.perf_counter() - start
        import ray

        ray.shutdown()

    df = result.output_for_node("evaluation")
    metadata = result.asset_materializations_for_node("evaluation")[0].metadata
    report = metadata["report"].value
    print(report)
    print(f"\nconfig: {json.dumps(config)}")
    print(f"problems: {df['problem_id'].nunique()}, total wall time {elapsed:.0f} s")
    per_arm = df.groupby("arm")[["tokens_in", "tokens_out", "wall_s", "calls"]].sum()
    per_arm["tokens"] = per_arm["tokens_in"] + per_arm["tokens_out"]
    base = per_arm.loc["A"]
    for arm, row in per_arm.iterrows():
        print(
            f"arm {arm}: tokens x{row['tokens'] / max(base['tokens'], 1):.1f} of A, "
            f"calls x{row['calls'] / max(base['calls'], 1):.1f}, "
            f"wall x{row['wall_s'] / max(base['wall_s'], 1e-9):.1f}"
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(report + "\n")
        png = re.search(r"base64,([A-Za-z0-9+/=]+)", metadata["plot"].value)
        if png:
            (args.out / "plot.png").write_bytes(base64.b64decode(png.group(1)))
        df.drop(columns=["candidate_details"]).to_csv(args.out / "per_problem.csv", index=False)
        print(f"wrote {args.out}/report.md, plot.png, per_problem.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
