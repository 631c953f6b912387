"""Planning sensor: `planning.plan.approved` -> deliberation runs.

The plans are read from whichever stream captures the subject (PLANNING_EVENTS, ours or the old
system's). The Dagster cursor holds that stream's name, its creation time and the last sequence
processed; messages are read by sequence with no consumer and never acknowledged, so a tick that
fails before Dagster stores its run requests simply reads the same messages again. The daemon
drops a RunRequest whose run_key this sensor already used, and the run_key is the event's
idempotency key + task id, so replays start nothing.

Each tick checks the cursor against the stream: a stream recreated (another creation time, or
the cursor past its last sequence) is a reset, which is logged as a warning and re-read from its
start; run keys keep that re-read exactly-once. A message that cannot be planned, whatever its
bytes, becomes a dead letter and the cursor moves past it: no message can stop the sensor.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import dagster as dg

from ..assets.deliberation import deliberation_partitions, deliberation_run_config
from ..events.planning import InvalidEvent, PlannedDeliberation, plan_deliberations
from ..events.redrive import publish_dead_letter
from ..events.streams import PLAN_APPROVED, NatsError, StreamPosition
from ..resources.council import CouncilResource
from ..resources.events import NatsResource

if TYPE_CHECKING:
    from ..events.bus import NatsSession

PLANNING_SENSOR = "planning_sensor"
MAX_EVENTS_PER_TICK = 250
MAX_TICK_SECONDS = 15.0  # Dagster's sensor timeout is 60 s
# Dagster's sensor daemon evaluates sensors in a fixed 5 s loop. A tick with nothing to read waits
# up to `wait_s` (FLEET_PLANNING_WAIT_S, default 3.5 s) for a plan to be published, so a plan is
# read the moment it comes most of the time instead of 2.5 s later on average
# (benchmarks/event_to_run.py). The interval lets every turn of the daemon's loop evaluate it.
MIN_INTERVAL_SECONDS = 1
ARRIVAL_SETTLE_S = 1.0


@dataclass(frozen=True)
class Cursor:
    """The last sequence processed, in which stream, created when (JSON in the Dagster cursor)."""

    seq: int
    stream: str | None = None
    created: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> Cursor | None:
        if not text:
            return None
        if text.isdigit():  # a cursor written before streams were checked: a bare sequence
            return cls(seq=int(text))
        value = json.loads(text)
        return cls(seq=int(value["seq"]), stream=value.get("stream"), created=value.get("created"))

    def dump(self) -> str:
        return json.dumps({"seq": self.seq, "stream": self.stream, "created": self.created})


def resume_point(cursor: Cursor | None, position: StreamPosition) -> tuple[int, str | None]:
    """The sequence to read after, and a warning when the stream is not where the cursor left it."""
    if cursor is None:
        return 0, None
    where = f"{position.stream} (seq {position.first_seq}..{position.last_seq}, created {position.created})"
    if cursor.stream is not None and cursor.stream != position.stream:
        return 0, f"plans now come from {where}, the cursor was on {cursor.stream}: reading it from its start"
    if cursor.created is not None and cursor.created != position.created:
        return (
            0,
            f"stream reset: {where} was recreated (cursor's was created {cursor.created}); re-reading it",
        )
    if cursor.seq > position.last_seq:
        return 0, f"stream reset: cursor seq {cursor.seq} is past the end of {where}; re-reading it"
    if cursor.seq < position.first_seq - 1:
        return cursor.seq, (
            f"seq {cursor.seq + 1}..{position.first_seq - 1} of {position.stream} "
            "expired before they were read"
        )
    return cursor.seq, None


@dataclass
class Drained:
    """What one tick read: the deliberations to start, the rejections, and how far it got."""

    cursor: Cursor
    after: int
    planned: list[PlannedDeliberation] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    warning: str | None = None
    error: str | None = None


async def drain(
    session: NatsSession,
    cursor: Cursor | None,
    max_events: int,
    max_seconds: float,
    start_at_end: bool = False,
    wait_s: float = 0.0,
) -> Drained:
    """Reads approved plans after the cursor; a bad one becomes a dead letter and the cursor moves
    past it. A lost connection ends the drain with the progress made so far.

    `start_at_end`: with no cursor yet, start after the stream's last message (read nothing now).
    `wait_s`: with nothing to read, wait this long for a plan to be published and read it then.
    """
    stream = await session.stream_for(PLAN_APPROVED)
    position = await session.position(stream)
    if cursor is None and start_at_end:
        at_end = Cursor(seq=position.last_seq, stream=stream, created=position.created)
        return Drained(cursor=at_end, after=position.last_seq)
    after, warning = resume_point(cursor, position)
    drained = Drained(
        cursor=Cursor(seq=after, stream=stream, created=position.created), after=after, warning=warning
    )
    deadline = time.monotonic() + max_seconds
    try:
        if wait_s <= 0:
            await _read(session, drained, max_events, deadline)
            return drained
        async with session.arrivals(PLAN_APPROVED) as arrived:
            await _read(session, drained, max_events, deadline)
            if drained.cursor.seq == after and await arrived(wait_s):
                # The stream stores a plan a moment after subscribers see it; a planner publishing
                # several plans at once has them read in this tick.
                settle = time.monotonic() + ARRIVAL_SETTLE_S
                while drained.cursor.seq == after and time.monotonic() < settle:
                    await asyncio.sleep(ARRIVAL_SETTLE_S / 5)
                    await _read(session, drained, max_events, deadline)
    except NatsError as exc:
        drained.error = str(exc)
    return drained


async def _read(session: NatsSession, drained: Drained, max_events: int, deadline: float) -> None:
    stream, created = drained.cursor.stream, drained.cursor.created
    async for message in session.read_after(stream, PLAN_APPROVED, drained.cursor.seq, max_events, deadline):
        try:
            drained.planned.extend(plan_deliberations(message))
        except InvalidEvent as exc:
            await publish_dead_letter(session, message, str(exc))
            drained.rejected.append((message.seq, str(exc)))
        drained.cursor = Cursor(seq=message.seq, stream=stream, created=created)


def run_requests(planned: list[PlannedDeliberation], council: CouncilResource) -> list[dg.RunRequest]:
    """One request per run key, even within a tick. A role the councils file routes to its own
    engine carries that engine's tag (the run queue limits runs per engine); the others get the
    job's (the stack's engine)."""
    unique = {p.run_key: p for p in planned}
    return [
        dg.RunRequest(
            run_key=p.run_key,
            partition_key=p.task_id,
            run_config=deliberation_run_config(p.task_config),
            tags={**p.run_tags(), **council.engine_tags(p.role)},
        )
        for p in unique.values()
    ]


def build_planning_sensor(
    job: dg.UnresolvedAssetJobDefinition, start_at_end: bool = False, wait_s: float = 0.0
) -> dg.SensorDefinition:
    """`start_at_end`: with no cursor yet, skip the plans already in the stream (a stream shared
    with the system we replace holds up to 30 days of plans it already deliberated on).
    `wait_s`: how long a tick with nothing to read waits for a plan to be published."""

    @dg.sensor(
        name=PLANNING_SENSOR,
        job=job,
        minimum_interval_seconds=MIN_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Starts a deliberation per task of each {PLAN_APPROVED} event (cursor = stream seq).",
    )
    def planning_sensor(context: dg.SensorEvaluationContext, nats: NatsResource, council: CouncilResource):
        cursor = Cursor.parse(context.cursor)
        at = cursor.seq if cursor else 0
        try:
            drained = nats.session(
                lambda s: drain(s, cursor, MAX_EVENTS_PER_TICK, MAX_TICK_SECONDS, start_at_end, wait_s)
            )
        except NatsError as exc:
            return dg.SkipReason(f"{exc}; cursor stays at {at}")
        if cursor is None and start_at_end:
            return dg.SensorResult(
                cursor=drained.cursor.dump(),
                skip_reason=f"first tick: starting after {drained.cursor.stream} seq {drained.cursor.seq} "
                "(FLEET_PLANNING_START=end); plans before it are not run",
            )
        if drained.warning:
            context.log.warning(drained.warning)
        for seq, reason in drained.rejected:
            context.log.warning(f"{drained.cursor.stream} seq {seq} rejected: {reason}")
        if drained.error:
            context.log.warning(f"stopped after seq {drained.cursor.seq}: {drained.error}")
        if drained.cursor == cursor:
            return dg.SkipReason(drained.error or f"no {PLAN_APPROVED} after seq {at}")
        requests = run_requests(drained.planned, council)
        partitions = list(dict.fromkeys(r.partition_key for r in requests))
        if requests:
            skip = None
        elif drained.cursor.seq == drained.after:
            skip = drained.warning or drained.error or f"no {PLAN_APPROVED} after seq {drained.after}"
        else:
            span = f"seq {drained.after + 1}..{drained.cursor.seq}"
            skip = f"{span}: {len(drained.rejected)} rejected, nothing to run"
        return dg.SensorResult(
            run_requests=requests,
            cursor=drained.cursor.dump(),
            dynamic_partitions_requests=[deliberation_partitions.build_add_request(partitions)]
            if partitions
            else [],
            skip_reason=skip,
        )

    return planning_sensor
