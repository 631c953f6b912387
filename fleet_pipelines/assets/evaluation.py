"""The nightly evaluation: arms A-E of councils on a benchmark sample, as one daily partition.

The asset value is one row per (problem, arm). Its metadata carries the markdown report, the
per-arm table, the paired comparisons D vs B and D vs C, and a PNG plot of pass@1 against tokens.
Its check flags a drop in pass@1 against the latest earlier partition that evaluated the same
problems with the same model and council shape.
"""

# No `from __future__ import annotations`: Dagster reads the asset's config annotation at import.
from typing import TYPE_CHECKING, cast

import dagster as dg
from pydantic import Field

from ..names import EVALUATION_GROUP, EVALUATION_JOB
from ..resources.council import CouncilResource
from ..resources.turns import RayTurnRunner
from .previews import table

if TYPE_CHECKING:
    from ..evaluation import arms as ev
    from ..evaluation.runner import EvaluationSettings
    from ..evaluation.suites import Split, Suite

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

    def run_settings(self, council: CouncilResource) -> "EvaluationSettings":
        """How every arm samples, with the council's sandbox limits and scoring weights."""
        from ..evaluation.runner import EvaluationSettings

        limits = {"sandbox": council.sandbox.to_model(), "weights": council.weights.to_model()}
        return EvaluationSettings(
            **self.model_dump(include=EvaluationSettings.model_fields.keys() - limits), **limits
        )

    def problems(self) -> "tuple[Suite, list[ev.Problem]]":
        """The suite and the problems it draws (explicit ids, or the seeded sample of the split)."""
        from ..evaluation.suites import get_suite, sample_problems

        suite = get_suite(self.suite)
        if self.split not in ("dev", "test", "all"):
            raise dg.Failure(description=f"split must be dev, test or all, not {self.split!r}")
        problems = sample_problems(
            suite, cast("Split", self.split), self.sample_size, self.seed, self.problem_ids
        )
        if not problems:
            raise dg.Failure(description=f"no problems in {self.suite} split {self.split}")
        return suite, problems


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
    from ..evaluation.report import SUMMARY_COLUMNS, EvaluationRun, drop_check, evaluation_report
    from ..evaluation.runner import run_problems

    suite, problems = config.problems()
    model, engine = turn_runner.model_name, turn_runner.engine.to_model()
    context.log.info(
        f"evaluating {len(problems)} {suite.name} problems with {model} "
        f"(N={config.num_agents}, R={config.rounds}) on Ray"
    )
    outcomes = run_problems(
        problems,
        config.run_settings(council),
        engine,
        turn_runner.dispatch_settings(),
        config.max_concurrent_problems,
        progress=context.log.info,
    )
    shape = config.model_dump(include={"suite", "num_agents", "rounds", "max_tokens"})
    run = EvaluationRun(
        context.partition_key,
        suite_label=suite.name,
        model=model,
        resamples=config.bootstrap_resamples,
        **shape,
    )
    report = evaluation_report(run, outcomes, {p.problem_id: suite.split_of(p) for p in problems})
    summary = table(report.summary.to_dict("records"), SUMMARY_COLUMNS)
    yield dg.Output(report.frame, metadata={**report.metadata, "summary": summary})
    yield drop_check(context, DROP_CHECK, report.fingerprint, report.overall, config.drop_tolerance)


evaluation_job = dg.define_asset_job(
    EVALUATION_JOB,
    selection=dg.AssetSelection.groups(EVALUATION_GROUP),
    partitions_def=evaluation_partitions,
    executor_def=dg.in_process_executor,
    description="Councils vs single agents on a benchmark with hidden tests (arms A-E, oracle).",
)
