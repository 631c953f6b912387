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
from ..settings import env

DEFAULT_CRON = "0 2 * * *"


def nightly_run_config() -> dict:
    return {
        "ops": {
            evaluation.op.name: {
                "config": {
                    "suite": env("FLEET_EVAL_SUITE", default="humaneval"),
                    "split": env("FLEET_EVAL_SPLIT", default="test"),
                    "sample_size": int(env("FLEET_EVAL_SAMPLE_SIZE", default="20")),
                }
            }
        }
    }


def build_nightly_evaluation() -> dg.ScheduleDefinition:
    running = env("FLEET_EVAL_SCHEDULE", default="off").lower() in {"on", "1", "true", "running"}

    @dg.schedule(
        name="nightly_evaluation",
        cron_schedule=env("FLEET_EVAL_CRON", default=DEFAULT_CRON),
        execution_timezone="UTC",
        job=evaluation_job,
        default_status=dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED,
        description="Evaluates councils against single agents on a benchmark sample every night.",
    )
    def nightly_evaluation(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        partition = context.scheduled_execution_time.strftime("%Y-%m-%d")
        return dg.RunRequest(run_key=partition, partition_key=partition, run_config=nightly_run_config())

    return nightly_evaluation
