"""The evaluation's report: per-problem and per-arm tables, the markdown report, the plot, and the
check against the previous comparable partition. Imported by the evaluation asset when it runs.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dagster as dg
import pandas as pd

from . import arms as ev

if TYPE_CHECKING:
    from .config import EvaluationConfig

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
    context: dg.AssetExecutionContext,
    check_name: str,
    key: str,
    current: dict[ev.Arm, float],
    tolerance: float,
) -> dg.AssetCheckResult:
    """The named check: did an arm's pass@1 fall by more than `tolerance` since the latest earlier
    partition with the same fingerprint?"""
    previous = _previous(context, key)
    if previous is None:
        return dg.AssetCheckResult(
            check_name=check_name,
            passed=True,
            metadata={"compared_with": "no earlier partition evaluated the same problems and model"},
        )
    partition, before = previous
    fallen = ev.drops(before, current, tolerance)
    return dg.AssetCheckResult(
        check_name=check_name,
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


@dataclass(frozen=True)
class EvaluationRun:
    """What one evaluation partition ran: its suite, model and council shape."""

    partition: str
    suite: str  # the suite as configured (one name, or several comma-separated)
    suite_label: str  # the suite's display name
    model: str
    num_agents: int
    rounds: int
    max_tokens: int
    resamples: int  # bootstrap resamples of the paired comparisons

    @classmethod
    def of(cls, config: EvaluationConfig, partition: str, suite_label: str, model: str) -> EvaluationRun:
        """What `config` runs on `partition`."""
        shape = config.model_dump(include={"suite", "num_agents", "rounds", "max_tokens"})
        return cls(
            partition, suite_label=suite_label, model=model, resamples=config.bootstrap_resamples, **shape
        )


PAIRS = (
    (ev.Arm.COUNCIL, ev.Arm.SAMPLED),
    (ev.Arm.COUNCIL, ev.Arm.PROPOSALS),
    (ev.Arm.FEEDBACK, ev.Arm.COUNCIL),
)


@dataclass(frozen=True)
class EvaluationReport:
    frame: pd.DataFrame  # one row per (problem, arm): the asset's value
    summary: pd.DataFrame  # one row per (split, arm)
    metadata: dict[str, dg.RawMetadataValue]  # report, plot, comparisons, pass@1 per arm
    overall: dict[ev.Arm, float]  # pass@1 per arm on the first split: what the drop check compares
    fingerprint: str


def evaluation_report(
    run: EvaluationRun, outcomes: list[ev.ArmOutcome], splits: dict[str, str]
) -> EvaluationReport:
    """The partition's value, its report and the figures its drop check compares."""
    summary = summary_frame(outcomes, splits)
    comparisons = [ev.paired_comparison(a, b, outcomes, resamples=run.resamples) for a, b in PAIRS]
    first_split = summary[summary["split"] == summary["split"].iloc[0]]
    overall = {ev.Arm(r["arm"]): float(r["pass_at_1"]) for r in first_split.to_dict("records")}
    header = (
        f"## Evaluation {run.partition}: {len(splits)} {run.suite_label} problems, "
        f"{run.model}, N={run.num_agents}, R={run.rounds}, max_tokens={run.max_tokens}"
    )
    png = plot_png(summary, header.removeprefix("## "))
    key = fingerprint(list(splits), run.model, run.suite, run.num_agents, run.rounds, run.max_tokens)
    metadata: dict[str, dg.RawMetadataValue] = {
        "report": dg.MetadataValue.md(report_markdown(summary, comparisons, header)),
        "plot": dg.MetadataValue.md(
            f"![pass@1 vs tokens](data:image/png;base64,{base64.b64encode(png).decode()})"
        ),
        "comparisons": dg.MetadataValue.json([c.model_dump(mode="json") for c in comparisons]),
        "problems": len(splits),
        "fingerprint": key,
        **{f"pass_at_1_{arm.value}": overall[arm] for arm in ev.Arm},
    }
    frame = outcomes_to_frame(outcomes, splits, run.partition)
    return EvaluationReport(frame, summary, metadata, overall, key)
