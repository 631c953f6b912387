"""Planning sensor: `planning.plan.approved` on PLANNING_EVENTS -> deliberation runs.

The Dagster cursor holds the last stream sequence processed; messages are read by sequence with
no consumer and never acknowledged, so a tick that fails before Dagster stores its run requests
simply reads the same messages again. The daemon drops a RunRequest whose run_key this sensor
already used, and the run_key is the event's idempotency key + task id, so replays start nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import dagster as dg

from ..assets.deliberation import deliberation_partitions, deliberation_run_config
from ..events.bus import NatsError, NatsSession
from ..events.outbound import rejected_event
from ..events.planning import InvalidEvent, PlannedDeliberation, plan_deliberations, rejection
from ..events.streams import PLAN_APPROVED, PLANNING_STREAM
from ..resources.events import NatsResource

PLANNING_SENSOR = "planning_sensor"
MAX_EVENTS_PER_TICK = 250
MAX_TICK_SECONDS = 15.0  # Dagster's sensor timeout is 60 s
MIN_INTERVAL_SECONDS = 5


@dataclass
class Drained:
    """What one tick read: the deliberations to start, the rejections, and how far it got."""

    cursor: int
    planned: list[PlannedDeliberation] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    error: str | None = None


async def drain(session: NatsSession, after_seq: int, max_events: int, max_seconds: float) -> Drained:
    """Reads approved plans after `after_seq`; a bad one goes to the dead letter subject and the
    cursor moves past it. A lost connection ends the drain with the progress made so far."""
    drained = Drained(cursor=after_seq)
    deadline = time.monotonic() + max_seconds
    try:
        async for message in session.read_after(
            PLANNING_STREAM, PLAN_APPROVED, after_seq, max_events, deadline
        ):
            try:
                drained.planned.extend(plan_deliberations(message))
            except InvalidEvent as exc:
                await session.publish(*rejected_event(rejection(message, str(exc))))
                drained.rejected.append((message.seq, str(exc)))
            drained.cursor = message.seq
    except NatsError as exc:
        drained.error = str(exc)
    return drained


def run_requests(planned: list[PlannedDeliberation]) -> list[dg.RunRequest]:
    unique = {p.run_key: p for p in planned}  # one request per run key, even within a tick
    return [
        dg.RunRequest(
            run_key=p.run_key,
            partition_key=p.task_id,
            run_config=deliberation_run_config(p.task_config),
            tags=p.run_tags(),
        )
        for p in unique.values()
    ]


def build_planning_sensor(
    job: dg.UnresolvedAssetJobDefinition, start_at_end: bool = False
) -> dg.SensorDefinition:
    """`start_at_end`: with no cursor yet, skip the plans already in the stream (a stream shared
    with the system we replace holds up to 30 days of plans it already deliberated on)."""

    @dg.sensor(
        name=PLANNING_SENSOR,
        job=job,
        minimum_interval_seconds=MIN_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Starts a deliberation per task of each {PLAN_APPROVED} event (cursor = stream seq).",
    )
    def planning_sensor(context: dg.SensorEvaluationContext, nats: NatsResource):
        if context.cursor is None and start_at_end:
            try:
                last = nats.session(lambda s: s.last_seq(PLANNING_STREAM))
            except NatsError as exc:
                return dg.SkipReason(f"{exc}; no cursor yet")
            return dg.SensorResult(
                cursor=str(last),
                skip_reason=f"first tick: starting after {PLANNING_STREAM} seq {last} "
                "(FLEET_PLANNING_START=end); plans before it are not run",
            )
        after = int(context.cursor or 0)
        try:
            drained = nats.session(lambda s: drain(s, after, MAX_EVENTS_PER_TICK, MAX_TICK_SECONDS))
        except NatsError as exc:
            return dg.SkipReason(f"{exc}; cursor stays at {after}")
        for seq, reason in drained.rejected:
            context.log.warning(f"{PLANNING_STREAM} seq {seq} rejected: {reason}")
        if drained.error:
            context.log.warning(f"stopped after seq {drained.cursor}: {drained.error}")
        if drained.cursor == after:
            return dg.SkipReason(drained.error or f"no {PLAN_APPROVED} after seq {after}")
        requests = run_requests(drained.planned)
        partitions = list(dict.fromkeys(r.partition_key for r in requests))
        return dg.SensorResult(
            run_requests=requests,
            cursor=str(drained.cursor),
            dynamic_partitions_requests=[deliberation_partitions.build_add_request(partitions)]
            if partitions
            else [],
            skip_reason=None
            if requests
            else f"seq {after + 1}..{drained.cursor}: {len(drained.rejected)} rejected, nothing to run",
        )

    return planning_sensor
