"""The nightly evaluation: arms A-E of councils on a benchmark sample, as one daily partition.

The asset value is one row per (problem, arm). Its metadata carries the markdown report, the
per-arm table, the paired comparisons D vs B and D vs C, and a PNG plot of pass@1 against tokens.
Its check flags a drop in pass@1 against the latest earlier partition that evaluated the same
problems with the same model and council shape.
"""

# No `from __future__ import annotations`: Dagster reads the asset's config annotation at import.
import dagster as dg

from ..evaluation.config import EvaluationConfig
from ..names import EVALUATION_GROUP, EVALUATION_JOB
from ..resources.council import CouncilResource
from ..resources.turns import RayTurnRunner
from .previews import table

DROP_CHECK = "no_drop_vs_previous_partition"

evaluation_partitions = dg.DailyPartitionsDefinition(start_date="2025-01-01", end_offset=1)


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
    model, shape = turn_runner.model_name, f"N={config.num_agents}, R={config.rounds}"
    context.log.info(f"evaluating {len(problems)} {suite.name} problems with {model} ({shape}) on Ray")
    outcomes = run_problems(
        problems,
        config.run_settings(council.sandbox.to_model(), council.weights.to_model()),
        turn_runner.engine.to_model(),
        turn_runner.dispatch_settings(),
        config.max_concurrent_problems,
        progress=context.log.info,
    )
    run = EvaluationRun.of(config, context.partition_key, suite.name, model)
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
