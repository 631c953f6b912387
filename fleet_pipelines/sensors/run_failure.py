"""Publishes `orchestration.deliberation.failed` for deliberation runs that crash before a decision.

A run that reached the decision asset has already published its outcome; the outcome event of a
run has one idempotency key (`outbound.outcome_key`), so JetStream would drop a second one anyway.
"""

from __future__ import annotations

import dagster as dg

from ..domain.models import DeliberationStatus
from ..events.models import DecisionRecord, DeliberationOutcome
from ..events.outbound import collector_failure_event, deliberation_outcome_event
from ..events.planning import TAG_CAUSATION, TAG_CORRELATION, TAG_PLAN, TAG_STORY
from ..resources.events import NatsResource

RUN_FAILURE_SENSOR = "deliberation_failure_sensor"
PARTITION_TAG = "dagster/partition"
DECISION = dg.AssetKey("decision")


def failure_outcome(instance: dg.DagsterInstance, run: dg.DagsterRun, message: str) -> DeliberationOutcome:
    task_id = run.tags[PARTITION_TAG]
    record = instance.get_run_record_by_id(run.run_id)
    started = record.start_time if record and record.start_time else None
    ended = record.end_time if record and record.end_time else None
    return DeliberationOutcome(
        task_id=task_id,
        story_id=run.tags.get(TAG_STORY),
        plan_id=run.tags.get(TAG_PLAN),
        status=DeliberationStatus.FAILED.value,
        winner_id=None,
        ranking=[],
        decisions=[
            DecisionRecord(
                id=f"{task_id}:{run.run_id}:failed",
                type="deliberation_failed",
                rationale=message,
                affected_subtask=task_id,
            )
        ],
        reasons=[message],
        duration_ms=(ended - started) * 1000 if started and ended else 0.0,
        run_id=run.run_id,
    )


def failure_message(context: dg.RunFailureSensorContext) -> str:
    """The run's failure and each failed step's own message (a dg.Failure's description)."""
    parts = [context.failure_event.message or f"run {context.dagster_run.run_id} failed"]
    for event in context.get_step_failure_events():
        data = event.step_failure_data
        detail = data.user_failure_data.description if data.user_failure_data else None
        parts.append(
            f"{event.step_key}: {detail or (data.error.message.strip() if data.error else 'failed')}"
        )
    return " | ".join(parts)


def build_run_failure_sensor(job: dg.UnresolvedAssetJobDefinition) -> dg.SensorDefinition:
    @dg.run_failure_sensor(
        name=RUN_FAILURE_SENSOR,
        monitored_jobs=[job],
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Publishes orchestration.deliberation.failed (and the old collector's "
        "deliberation.failed) for runs that fail before a decision.",
    )
    def deliberation_failure_sensor(context: dg.RunFailureSensorContext, nats: NatsResource):
        run = context.dagster_run
        if PARTITION_TAG not in run.tags:
            return dg.SkipReason(f"run {run.run_id} has no partition: not a deliberation")
        decided = any(
            e.dagster_event is not None and e.dagster_event.asset_key == DECISION
            for e in context.instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        )
        if decided:
            return dg.SkipReason(f"run {run.run_id} reached a decision, which published the outcome")
        outcome = failure_outcome(context.instance, run, failure_message(context))
        nats.publish(
            [
                deliberation_outcome_event(
                    outcome, run.tags.get(TAG_CORRELATION), run.tags.get(TAG_CAUSATION)
                ),
                collector_failure_event(outcome.task_id, run.run_id, outcome.decisions[0].rationale),
            ]
        )
        context.log.info(f"published deliberation.failed for task {outcome.task_id} (run {run.run_id})")
        return None

    return deliberation_failure_sensor
