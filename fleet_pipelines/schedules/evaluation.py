"""`nightly_evaluation`: one evaluation_job run per day, on that day's partition.

Configured from the environment when the code location loads:
- FLEET_EVAL_CRON: cron expression in UTC (default "0 2 * * *");
- FLEET_EVAL_SCHEDULE: "on" starts the schedule running (production values set it); anything
  else leaves it STOPPED, so `make dev` never spends the CPU on a nightly run unless asked;
- FLEET_EVAL_SUITE, FLEET_EVAL_SPLIT, FLEET_EVAL_SAMPLE_SIZE: what the nightly run evaluates.
"""

from __future__ import annotations

import dagster as dg

from ..assets.evaluation import evaluation, evaluation_job
from ..settings import FleetSettings


def nightly_run_config(settings: FleetSettings) -> dict:
    return {
        "ops": {
            evaluation.op.name: {
                "config": {
                    "suite": settings.eval_suite,
                    "split": settings.eval_split,
                    "sample_size": settings.eval_sample_size,
                }
            }
        }
    }


def build_nightly_evaluation(settings: FleetSettings) -> dg.ScheduleDefinition:
    running = settings.eval_schedule_running

    @dg.schedule(
        name="nightly_evaluation",
        cron_schedule=settings.eval_cron,
        execution_timezone="UTC",
        job=evaluation_job,
        default_status=dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED,
        description="Evaluates councils against single agents on a benchmark sample every night.",
    )
    def nightly_evaluation(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        partition = context.scheduled_execution_time.strftime("%Y-%m-%d")
        return dg.RunRequest(
            run_key=partition, partition_key=partition, run_config=nightly_run_config(settings)
        )

    return nightly_evaluation
