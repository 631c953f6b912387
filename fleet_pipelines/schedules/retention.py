"""The decision log's hourly build and the retention job (history/retention.py) on schedules.

- `decision_log_hourly` (cron `5 * * * *`): rebuilds today's and yesterday's decision log tables;
- `deliberation_retention` (FLEET_RETENTION_CRON, default `35 * * * *`): runs `retention_job`,
  which removes deliberations decided more than FLEET_RETENTION_SECONDS ago (alias
  DELIBERATION_CLEANUP; default 14 days) that are in the decision log, with their stored values.
Both run by default: without them partitions and files grow without bound.
"""

from datetime import timedelta

import dagster as dg

from ..assets.decision_log import decision_log_job
from ..assets.deliberation import STORED_ASSETS
from ..history.log import DAY_FORMAT
from ..history.retention import expire
from ..names import DELIBERATION_PARTITIONS, RETENTION_JOB
from ..resources.history import HistoryResource
from ..settings import FleetSettings

REPORT_LIMIT = 200


@dg.op(out=dg.Out(dg.Nothing))
def expire_deliberations(context: dg.OpExecutionContext, history: HistoryResource):
    """Removes expired deliberations that are in the decision log, with their stored values."""
    report = expire(
        context.instance,
        history.base_path,
        DELIBERATION_PARTITIONS,
        STORED_ASSETS,
        history.max_age_seconds,
        remove_workspace=history.remove_workspace,
    )
    context.log.info(report.summary())
    shown = report.removed[:REPORT_LIMIT]
    more = f"\n\n… and {len(report.removed) - len(shown)} more" if len(report.removed) > len(shown) else ""
    return dg.Output(
        None,
        metadata={
            "summary": report.summary(),
            "removed": len(report.removed),
            "files_removed": report.files_removed,
            "workspaces_removed": report.workspaces_removed,
            "not_logged": len(report.not_logged),
            "removed_by_day": dg.MetadataValue.json(report.removed_by_day),
            "removed_tasks": dg.MetadataValue.md("\n".join(f"- {t}" for t in shown) + more or "_none_"),
        },
    )


@dg.job(name=RETENTION_JOB, executor_def=dg.in_process_executor)
def retention_job():
    """Removes deliberations older than the retention age (once in the decision log)."""
    expire_deliberations()


def build_history_schedules(settings: FleetSettings) -> list[dg.ScheduleDefinition]:
    @dg.schedule(
        name="decision_log_hourly",
        cron_schedule="5 * * * *",
        execution_timezone="UTC",
        job=decision_log_job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Rebuilds today's and yesterday's decision log tables.",
    )
    def decision_log_hourly(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest]:
        at = context.scheduled_execution_time
        days = [(at - timedelta(days=1)).strftime(DAY_FORMAT), at.strftime(DAY_FORMAT)]
        return [dg.RunRequest(run_key=f"{day}@{at:%Y-%m-%dT%H}", partition_key=day) for day in days]

    retention = dg.ScheduleDefinition(
        name="deliberation_retention",
        cron_schedule=settings.retention_cron,
        execution_timezone="UTC",
        job=retention_job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Removes deliberations older than the retention age that are in the decision log.",
    )
    return [decision_log_hourly, retention]
