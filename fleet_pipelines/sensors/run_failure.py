"""Publishes the outcome of deliberation runs that failed before their `decision_events` step.

- A run that stored its decision and then failed (a blocking check: quorum not met, TIMEOUT) gets
  the outcome of that decision, read from storage;
- a run that crashed before deciding gets `orchestration.deliberation.failed` with the failure.

The outcome event of a run has one idempotency key (`outbound.outcome_key`), so JetStream drops a
second one. Events NATS does not take wait in the outbox.
"""

from __future__ import annotations

import dagster as dg

from ..domain.models import DeliberationStatus
from ..events.models import DecisionRecord, DeliberationOutcome
from ..events.outbound import collector_failure_event, deliberation_outcome_event, outcome_events
from ..events.outbox import Event
from ..history.runs import run_times
from ..history.stored import read_stored_entry
from ..names import (
    COUNCIL,
    DECISION,
    DECISION_EVENTS,
    PARTITION_TAG,
    PROPOSALS,
    RUN_FAILURE_SENSOR,
    TAG_CAUSATION,
    TAG_CORRELATION,
    TAG_PLAN,
    TAG_ROLE,
    TAG_STORY,
)
from ..resources.events import NatsResource
from ..resources.history import HistoryResource


def _duration_ms(instance: dg.DagsterInstance, run_id: str) -> float:
    started, ended = run_times(instance, run_id)
    return (ended - started) * 1000 if started and ended else 0.0


def failure_outcome(instance: dg.DagsterInstance, run: dg.DagsterRun, message: str) -> DeliberationOutcome:
    task_id = run.tags[PARTITION_TAG]
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
        duration_ms=_duration_ms(instance, run.run_id),
        run_id=run.run_id,
        role=run.tags.get(TAG_ROLE),
    )


def stored_events(instance: dg.DagsterInstance, run: dg.DagsterRun, base_path: str) -> list[Event]:
    """The outcome events of the decision this run stored (none: it stored none)."""
    task_id = run.tags[PARTITION_TAG]
    stored = {name: read_stored_entry(base_path, name, task_id) for name in (COUNCIL, PROPOSALS, DECISION)}
    if any(entry is None or entry[1] != run.run_id for entry in stored.values()):
        return []
    task, proposals, decision = stored[COUNCIL][0].task, stored[PROPOSALS][0], stored[DECISION][0]
    correlation, causation = run.tags.get(TAG_CORRELATION), run.tags.get(TAG_CAUSATION)
    duration_ms = _duration_ms(instance, run.run_id)
    return outcome_events(task, decision, proposals, run.run_id, duration_ms, correlation, causation)


def failure_events(instance: dg.DagsterInstance, run: dg.DagsterRun, message: str) -> list[Event]:
    outcome = failure_outcome(instance, run, message)
    correlation, causation = run.tags.get(TAG_CORRELATION), run.tags.get(TAG_CAUSATION)
    return [
        deliberation_outcome_event(outcome, correlation, causation),
        collector_failure_event(outcome.task_id, run.run_id, message),
    ]


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
        description="Publishes orchestration.deliberation.completed|failed (and the old collector's "
        "deliberation.failed) for runs that fail before their decision_events step.",
    )
    def deliberation_failure_sensor(
        context: dg.RunFailureSensorContext, nats: NatsResource, history: HistoryResource
    ):
        run = context.dagster_run
        if PARTITION_TAG not in run.tags:
            return dg.SkipReason(f"run {run.run_id} has no partition: not a deliberation")
        materialized = {
            e.dagster_event.asset_key.to_user_string()
            for e in context.instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
            if e.dagster_event is not None and e.dagster_event.asset_key is not None
        }
        if DECISION_EVENTS in materialized:
            return dg.SkipReason(f"run {run.run_id} published its outcome in {DECISION_EVENTS}")
        stored = stored_events(context.instance, run, history.base_path) if DECISION in materialized else []
        events = stored or failure_events(context.instance, run, failure_message(context))
        sink = nats.deliver(run.run_id, events)
        pending = f"; {sink.kept} kept in the outbox: {sink.unreachable}" if sink.kept else ""
        what = "its stored decision's outcome" if stored else "deliberation.failed"
        context.log.info(f"published {what} for task {run.tags[PARTITION_TAG]} (run {run.run_id}){pending}")
        return None

    return deliberation_failure_sensor
