"""Sends the events runs kept in the outbox (events/outbox.py) once NATS takes them again.

A run that is still going sends its own kept events with its next step; this sensor sends those of
runs that have ended, oldest first, with their original idempotency keys (JetStream drops any copy).
"""

from __future__ import annotations

import dagster as dg

from ..names import OUTBOX_SENSOR
from ..resources.events import NatsResource

INTERVAL_S = 30
_GOING = {
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
}


def ended_runs(instance: dg.DagsterInstance, run_ids: list[str]) -> list[str]:
    """The runs that are not going any more (a run the instance does not know counts as ended)."""
    ended = []
    for run_id in run_ids:
        run = instance.get_run_by_id(run_id)
        if run is None or run.status not in _GOING:
            ended.append(run_id)
    return ended


def build_outbox_sensor() -> dg.SensorDefinition:
    @dg.sensor(
        name=OUTBOX_SENSOR,
        minimum_interval_seconds=INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Publishes the events that runs kept while NATS was unreachable.",
    )
    def event_outbox_sensor(context: dg.SensorEvaluationContext, nats: NatsResource) -> dg.SkipReason:
        outbox = nats.outbox()
        runs = ended_runs(context.instance, outbox.runs()) if outbox is not None else []
        if not runs:
            return dg.SkipReason("no kept events of ended runs")
        report = nats.flush_outbox(runs)
        why = f"; NATS: {report.error}" if report.error else ""
        return dg.SkipReason(
            f"sent {report.sent} kept events of {len(runs)} runs ({report.duplicates} already in the "
            f"stream); {report.pending} pending{why}"
        )

    return event_outbox_sensor
