"""A tiny real evaluation: llama.cpp server (SmolLM2-135M), Ray head, Dagster instance, sandbox."""

from __future__ import annotations

import base64
import json
import re

import dagster as dg
import pytest

from fleet_pipelines.assets.evaluation import DROP_CHECK, evaluation
from fleet_pipelines.evaluation.arms import Arm
from fleet_pipelines.evaluation.report import fingerprint

PROBLEMS = ["HumanEval/23", "HumanEval/2"]  # strlen, truncate_number: the easiest of the dev split
CONFIG = {
    "suite": "humaneval",
    "problem_ids": PROBLEMS,
    "num_agents": 2,
    "rounds": 1,
    "max_tokens": 40,  # the greedy strlen (32 tokens) fits, and passes; 128 took 219 s, 64 ~70 s
    "max_samples_b": 2,  # D's token budget buys more: B samples 2 and selects between them
    "max_concurrent_problems": 2,
    "bootstrap_resamples": 500,
}


@pytest.mark.heavy(45)
def test_tiny_evaluation_runs_every_arm_and_reports(stack_env, dagster_instance):
    # An earlier partition of the same problems and model where every arm passed everything: the
    # drop check must flag every arm that now scores below 1.0 by more than the tolerance.
    model = stack_env["turn_runner"].model_name
    dagster_instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key="evaluation",
            partition="2026-01-01",
            metadata={
                "fingerprint": fingerprint(PROBLEMS, model, "humaneval", 2, 1, CONFIG["max_tokens"]),
                **{f"pass_at_1_{arm.value}": 1.0 for arm in Arm},
            },
        )
    )
    result = dg.materialize(
        [evaluation],
        resources=stack_env,
        instance=dagster_instance,
        partition_key="2026-01-02",
        run_config={"ops": {"evaluation": {"config": CONFIG}}},
    )
    assert result.success
    df = result.output_for_node("evaluation")
    assert sorted(zip(df["problem_id"], df["arm"], strict=True)) == sorted(
        (p, a.value) for p in PROBLEMS for a in Arm
    )
    by_arm = {arm: df[df["arm"] == arm] for arm in "ABCDE"}
    assert (by_arm["A"]["calls"] == 1).all() and (by_arm["A"]["candidates"] == 1).all()
    assert (by_arm["C"]["calls"] == 2).all() and (by_arm["C"]["candidates"] == 2).all()
    # D: 2 proposals, then each agent critiques the other and revises (when turns succeed).
    assert (by_arm["D"]["calls"] >= 2).all() and (by_arm["D"]["candidates"] == 2).all()
    assert (by_arm["E"]["calls"] >= 2).all() and (by_arm["E"]["candidates"] == 2).all()
    assert by_arm["B"]["calls"].between(1, 2).all()
    assert (df["tokens_in"] > 0).all() and (df["tokens_out"] > 0).all() and (df["wall_s"] > 0).all()

    for row in df.to_dict("records"):
        candidates = json.loads(row["candidate_details"])
        assert row["oracle"] == any(c["passed"] for c in candidates)
        chosen = [c for c in candidates if c["agent_id"] == row["selected_agent"]]
        assert row["passed"] == (bool(chosen) and chosen[0]["passed"])
        for c in candidates:
            assert c["hidden_status"] in {"passed", "failed", "timeout", "error", "no_code"}
            assert c["passed"] == (c["hidden_status"] == "passed")

    metadata = result.asset_materializations_for_node("evaluation")[0].metadata
    report = metadata["report"].value
    assert "D vs B" in report and "D vs C" in report and "E vs D" in report and "McNemar" in report
    png = re.search(r"base64,([A-Za-z0-9+/=]+)", metadata["plot"].value).group(1)
    assert base64.b64decode(png).startswith(b"\x89PNG")
    assert len(metadata["summary"].value.records) == len(Arm)
    # Progress in the run log: a line for each problem and arm as its problem finished.
    lines = [
        e.user_message
        for e in dagster_instance.all_logs(result.run_id)
        if e.user_message.startswith("evaluation ")
    ]
    total = len(PROBLEMS) * len(Arm)
    assert sorted(line.split(": ")[1].split(" (")[0].rsplit(" ", 1)[0] for line in lines) == sorted(
        f"{p} arm {a.value}" for p in PROBLEMS for a in Arm
    )
    assert lines[-1].startswith(f"evaluation {total}/{total}: ") and lines[-1].endswith("all problems done")
    assert all("passes so far A " in line and "tokens in all" in line for line in lines)
    current = {arm: metadata[f"pass_at_1_{arm.value}"].value for arm in Arm}
    assert current["A"] == by_arm["A"]["passed"].mean()

    check = result.get_asset_check_evaluations()[0]
    assert check.check_name == DROP_CHECK
    assert check.metadata["compared_with"].value == "2026-01-01"
    assert check.passed == all(v >= 0.95 for v in current.values())
