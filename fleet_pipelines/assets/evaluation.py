"""The nightly evaluation: arms A-E of councils on a benchmark sample, as one daily partition.

The asset value is one row per (problem, arm). Its metadata carries the markdown report, the
per-arm table, the paired comparisons D vs B and D vs C, and a PNG plot of pass@1 against tokens.
Its check flags a drop in pass@1 against the latest earlier partition that evaluated the same
problems with the same model and council shape.
"""

import base64
from typing import cast

import dagster as dg
from pydantic import Field

from ..names import EVALUATION_GROUP, EVALUATION_JOB
from ..resources.council import CouncilResource
from ..resources.turns import RayTurnRunner
from .previews import table

DROP_CHECK = "no_drop_vs_previous_partition"

evaluation_partitions = dg.DailyPartitionsDefinition(start_date="2025-01-01", end_offset=1)


class EvaluationConfig(dg.Config):
    """Which problems, and how each arm samples. Defaults: 10 dev problems, N=3, R=1."""

    suite: str = Field(
        default="humaneval",
        description="Benchmark suite: humaneval, fleet or repos, or several comma-separated.",
    )
    split: str = Field(default="dev", description="dev (HumanEval 0-39, for tuning), test (the rest) or all.")
    sample_size: int = Field(default=10, description="Problems drawn from the split (0: all of it).")
    seed: int = Field(default=0, description="Seed of the sample: the same seed gives the same problems.")
    problem_ids: list[str] = Field(
        default_factory=list, description="Explicit problems (e.g. HumanEval/0); overrides the sample."
    )
    num_agents: int = Field(default=3, description="N: council size, proposals of arm C.")
    rounds: int = Field(default=1, description="R: review rounds of arm D.")
    temperature: float = Field(default=0.7, description="Baseline temperature of arms B, C, D.")
    max_tokens: int = Field(default=256, description="Completion limit of every turn.")
    max_samples_b: int = Field(default=32, description="Cap on arm B's samples per problem.")
    problem_timeout_s: float = Field(default=900.0, description="Deadline of all turns of one problem.")
    max_concurrent_problems: int = Field(default=2, description="Problems evaluated at once on Ray.")
    bootstrap_resamples: int = Field(default=10_000, description="Bootstrap resamples over problems.")
    drop_tolerance: float = Field(
        default=0.05, description="The check flags a pass@1 fall larger than this (absolute)."
    )


@dg.asset(
    partitions_def=evaluation_partitions,
    group_name=EVALUATION_GROUP,
    kinds={"ray", "python"},
    check_specs=[dg.AssetCheckSpec(DROP_CHECK, asset="evaluation")],
    io_manager_key="frames_io_manager",
)
def evaluation(
    context: dg.AssetExecutionContext,
    config: EvaluationConfig,
    council: CouncilResource,
    turn_runner: RayTurnRunner,
):
    """Arms A (greedy), B (k samples + selector at D's token budget), C (N proposals + selector)
    and D (council + selector) on the hidden tests of a benchmark sample."""
    # Imported here: the code location loads without numpy, pandas and Ray.
    from ..domain import evaluation as ev
    from ..evaluation.report import (
        SUMMARY_COLUMNS,
        drop_check,
        fingerprint,
        outcomes_to_frame,
        plot_png,
        report_markdown,
        summary_frame,
    )
    from ..evaluation.runner import EvaluationSettings, run_problems
    from ..evaluation.suites import Split, get_suite, sample_problems

    suite = get_suite(config.suite)
    if config.split not in ("dev", "test", "all"):
        raise dg.Failure(description=f"split must be dev, test or all, not {config.split!r}")
    split = cast(Split, config.split)
    problems = sample_problems(suite, split, config.sample_size, config.seed, config.problem_ids)
    if not problems:
        raise dg.Failure(description=f"no problems in {config.suite} split {config.split}")
    settings = EvaluationSettings(
        num_agents=config.num_agents,
        rounds=config.rounds,
        temperature=config.temperature,
        max_tokens=config.max_tokens,
        max_samples_b=config.max_samples_b,
        problem_timeout_s=config.problem_timeout_s,
        sandbox=council.sandbox.to_model(),
        weights=council.weights.to_model(),
    )
    context.log.info(
        f"evaluating {len(problems)} {suite.name} problems with {turn_runner.model_name} "
        f"(N={config.num_agents}, R={config.rounds}) on Ray"
    )
    outcomes = run_problems(
        problems,
        settings,
        turn_runner.engine.to_model(),
        turn_runner.dispatch_settings(),
        config.max_concurrent_problems,
        progress=context.log.info,
    )
    splits = {p.problem_id: suite.split_of(p) for p in problems}
    df = outcomes_to_frame(outcomes, splits, context.partition_key)
    summary = summary_frame(outcomes, splits)
    comparisons = [
        ev.paired_comparison(first, second, outcomes, resamples=config.bootstrap_resamples)
        for first, second in (
            (ev.Arm.COUNCIL, ev.Arm.SAMPLED),
            (ev.Arm.COUNCIL, ev.Arm.PROPOSALS),
            (ev.Arm.FEEDBACK, ev.Arm.COUNCIL),
        )
    ]
    first_split = summary[summary["split"] == summary["split"].iloc[0]]
    overall = {ev.Arm(r["arm"]): float(r["pass_at_1"]) for r in first_split.to_dict("records")}
    header = (
        f"## Evaluation {context.partition_key}: {len(problems)} {suite.name} problems, "
        f"{turn_runner.model_name}, N={config.num_agents}, R={config.rounds}, max_tokens={config.max_tokens}"
    )
    png = plot_png(summary, header.removeprefix("## "))
    key = fingerprint(
        [p.problem_id for p in problems],
        turn_runner.model_name,
        config.suite,
        config.num_agents,
        config.rounds,
        config.max_tokens,
    )
    metadata: dict[str, dg.RawMetadataValue] = {
        "report": dg.MetadataValue.md(report_markdown(summary, comparisons, header)),
        "summary": table(summary.to_dict("records"), SUMMARY_COLUMNS),
        "plot": dg.MetadataValue.md(
            f"![pass@1 vs tokens](data:image/png;base64,{base64.b64encode(png).decode()})"
        ),
        "comparisons": dg.MetadataValue.json([c.model_dump(mode="json") for c in comparisons]),
        "problems": len(problems),
        "fingerprint": key,
        **{f"pass_at_1_{arm.value}": float(overall[arm]) for arm in ev.Arm},
    }
    check = drop_check(context, DROP_CHECK, key, overall, config.drop_tolerance)
    yield dg.Output(df, metadata=metadata)
    yield check


evaluation_job = dg.define_asset_job(
    EVALUATION_JOB,
    selection=dg.AssetSelection.groups(EVALUATION_GROUP),
    partitions_def=evaluation_partitions,
    executor_def=dg.in_process_executor,
    description="Councils vs single agents on a benchmark with hidden tests (arms A-E, oracle).",
)
