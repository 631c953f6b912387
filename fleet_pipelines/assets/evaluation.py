"""The nightly evaluation: arms A-D of councils on a benchmark sample, as one daily partition.

The asset value is one row per (problem, arm). Its metadata carries the markdown report, the
per-arm table, the paired comparisons D vs B and D vs C, and a PNG plot of pass@1 against tokens.
Its check flags a drop in pass@1 against the latest earlier partition that evaluated the same
problems with the same model and council shape.
"""

import base64
import hashlib
import io
import json
from typing import cast

import dagster as dg
import pandas as pd
from pydantic import Field

from ..domain import evaluation as ev
from ..evaluation.runner import EvaluationSettings, run_problems
from ..evaluation.suites import Split, get_suite, sample_problems
from ..resources.council import CouncilResource
from ..resources.turns import RayTurnRunner
from .previews import table

GROUP = "evaluation"
DROP_CHECK = "no_drop_vs_previous_partition"
evaluation_partitions = dg.DailyPartitionsDefinition(start_date="2025-01-01", end_offset=1)

SUMMARY_COLUMNS = [
    "split",
    "arm",
    "problems",
    "solved",
    "pass_at_1",
    "oracle",
    "one_sample",
    "selection_efficiency",
    "tokens_in_per_problem",
    "tokens_out_per_problem",
    "calls_per_problem",
    "wall_s_per_problem",
    "tokens_per_solved",
    "wall_s_per_solved",
]


class EvaluationConfig(dg.Config):
    """Which problems, and how each arm samples. Defaults: 10 dev problems, N=3, R=1."""

    suite: str = Field(default="humaneval", description="Benchmark suite: humaneval or fleet.")
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


def outcomes_to_frame(outcomes: list[ev.ArmOutcome], splits: dict[str, str], partition: str) -> pd.DataFrame:
    rows = []
    for o in outcomes:
        chosen = o.candidates[o.selected] if o.selected is not None else None
        rows.append(
            {
                "partition": partition,
                "split": splits[o.problem_id],
                "problem_id": o.problem_id,
                "arm": o.arm.value,
                "passed": o.passed,
                "oracle": o.oracle,
                "one_sample": o.one_sample,
                "candidates": len(o.candidates),
                "selected_agent": chosen.agent_id if chosen else None,
                "selected_examples_passed": chosen.examples_passed if chosen else 0,
                "examples_total": o.candidates[0].examples_total if o.candidates else 0,
                "tokens_in": o.tokens_in,
                "tokens_out": o.tokens_out,
                "calls": o.calls,
                "failed_calls": o.failed_calls,
                "wall_s": o.wall_s,
                "candidate_details": json.dumps([c.model_dump() for c in o.candidates]),
            }
        )
    return pd.DataFrame(rows)


def summary_frame(outcomes: list[ev.ArmOutcome], splits: dict[str, str]) -> pd.DataFrame:
    """Per-arm metrics for each split present and for all problems together."""
    groups = {"all": outcomes}
    for split in sorted(set(splits.values())):
        groups[split] = [o for o in outcomes if splits[o.problem_id] == split]
    if len(groups) == 2:  # one split only: "all" repeats it
        groups.pop("all")
    rows = [
        {"split": name, **ev.summarize_arm(arm, group).model_dump(mode="json")}
        for name, group in groups.items()
        for arm in ev.Arm
    ]
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def report_markdown(summary: pd.DataFrame, comparisons: list[ev.PairedComparison], header: str) -> str:
    lines = [header, ""]
    for split, rows in summary.groupby("split", sort=False):
        lines += [
            f"### {split}",
            "",
            "| arm | pass@1 | solved | oracle | one sample | sel. eff. | tok in/pb | tok out/pb "
            "| calls/pb | wall s/pb | tok/solved | wall s/solved |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows.to_dict("records"):
            lines.append(
                f"| {ev.ARM_LABELS[ev.Arm(r['arm'])]} | {_fmt(r['pass_at_1'])} "
                f"| {r['solved']}/{r['problems']} "
                f"| {_fmt(r['oracle'])} | {_fmt(r['one_sample'])} | {_fmt(r['selection_efficiency'])} "
                f"| {_fmt(r['tokens_in_per_problem'], 0)} | {_fmt(r['tokens_out_per_problem'], 0)} "
                f"| {_fmt(r['calls_per_problem'], 1)} | {_fmt(r['wall_s_per_problem'], 1)} "
                f"| {_fmt(r['tokens_per_solved'], 0)} | {_fmt(r['wall_s_per_solved'], 1)} |"
            )
        lines.append("")
    lines += ["### paired comparisons (all problems)", ""]
    for c in comparisons:
        lines.append(
            f"- **{c.first.value} vs {c.second.value}**: difference {c.difference:+.3f}, "
            f"{c.confidence:.0%} bootstrap interval [{c.ci_low:+.3f}, {c.ci_high:+.3f}], "
            f"exact McNemar p = {c.mcnemar_p:.3g} (only {c.first.value}: {c.only_first}, "
            f"only {c.second.value}: {c.only_second}, both: {c.both}, neither: {c.neither})"
        )
    return "\n".join(lines)


def plot_png(summary: pd.DataFrame, title: str) -> bytes:
    """Pass@1 (filled) and oracle (hollow) of each arm against its tokens per problem."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = summary[summary["split"] == summary["split"].iloc[0]]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for r in rows.to_dict("records"):
        tokens = r["tokens_in_per_problem"] + r["tokens_out_per_problem"]
        line = ax.plot(tokens, r["pass_at_1"], "o", markersize=9, label=ev.ARM_LABELS[ev.Arm(r["arm"])])
        ax.plot(tokens, r["oracle"], "o", markersize=9, mfc="none", color=line[0].get_color())
        ax.annotate(r["arm"], (tokens, r["pass_at_1"]), textcoords="offset points", xytext=(6, 4))
    ax.set_xscale("log")
    ax.set_xlabel("tokens (in + out) per problem")
    ax.set_ylabel("pass@1 (filled) · oracle (hollow)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def fingerprint(
    problem_ids: list[str], model: str, suite: str, num_agents: int, rounds: int, max_tokens: int
) -> str:
    """What makes two partitions comparable: same problems, model and council shape."""
    key = json.dumps([suite, problem_ids, model, num_agents, rounds, max_tokens])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _previous(context: dg.AssetExecutionContext, key: str) -> tuple[str, dict[ev.Arm, float]] | None:
    """pass@1 per arm of the latest earlier partition with the same fingerprint."""
    records = context.instance.fetch_materializations(context.asset_key, limit=200).records
    for record in records:
        partition = record.partition_key
        metadata = record.asset_materialization.metadata if record.asset_materialization else {}
        if partition is None or partition >= context.partition_key:
            continue
        if metadata.get("fingerprint") is None or metadata["fingerprint"].value != key:
            continue
        return partition, {arm: metadata[f"pass_at_1_{arm.value}"].value for arm in ev.Arm}
    return None


def drop_check(
    context: dg.AssetExecutionContext, key: str, current: dict[ev.Arm, float], tolerance: float
) -> dg.AssetCheckResult:
    previous = _previous(context, key)
    if previous is None:
        return dg.AssetCheckResult(
            check_name=DROP_CHECK,
            passed=True,
            metadata={"compared_with": "no earlier partition evaluated the same problems and model"},
        )
    partition, before = previous
    fallen = ev.drops(before, current, tolerance)
    return dg.AssetCheckResult(
        check_name=DROP_CHECK,
        passed=not fallen,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            "; ".join(f"arm {d.arm.value}: {d.previous:.3f} -> {d.current:.3f}" for d in fallen)
            or f"no arm fell by more than {tolerance:.3f}"
        ),
        metadata={
            "compared_with": partition,
            "tolerance": tolerance,
            **{f"previous_{arm.value}": before[arm] for arm in ev.Arm},
            **{f"current_{arm.value}": current[arm] for arm in ev.Arm},
        },
    )


@dg.asset(
    partitions_def=evaluation_partitions,
    group_name=GROUP,
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
    )
    splits = {p.problem_id: suite.split_of(p) for p in problems}
    df = outcomes_to_frame(outcomes, splits, context.partition_key)
    summary = summary_frame(outcomes, splits)
    comparisons = [
        ev.paired_comparison(ev.Arm.COUNCIL, other, outcomes, resamples=config.bootstrap_resamples)
        for other in (ev.Arm.SAMPLED, ev.Arm.PROPOSALS)
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
    check = drop_check(context, key, overall, config.drop_tolerance)
    yield dg.Output(df, metadata=metadata)
    yield check


evaluation_job = dg.define_asset_job(
    "evaluation_job",
    selection=dg.AssetSelection.groups(GROUP),
    partitions_def=evaluation_partitions,
    executor_def=dg.in_process_executor,
    description="Councils vs single agents on a benchmark with hidden tests (arms A-D, oracle).",
)
