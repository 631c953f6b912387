"""The fleet's exporter: deliberations, planning events, the outbox and the planning sensor, as
Prometheus metrics read from durable sources (`fleet metrics serve`; a Deployment on the cluster).

Each `interval_s` it
- reads the outcome events (`orchestration.deliberation.completed|failed`) and the refused plans
  (`orchestration.planning.rejected`) through a durable JetStream consumer of its own
  (`fleet-metrics`), acknowledging each once counted: events published while it was down are
  counted when it is back;
- counts the planning events the planning sensor accepted: the distinct planning messages
  (`fleet/planning_seq`) of the runs it started, from Dagster's run storage;
- counts the sandbox runs of the scored proposals (the `tests` check of each, by status) from the
  `scores` materializations in Dagster's event log (their `evidence`), and whether each decided
  run's winner passed its hard checks (`gate_failures` on that evidence, the `decision`'s winner),
  by the role its `outcome` metadata names;
- sets the gauges: runs queued and in flight per engine (run storage: each run's `fleet/engine`
  tag, as the run queue counts them against its per-engine limit), the planning sensor's lag (its
  cursor in Dagster's storage against the planning stream's end) and the outbox (events kept,
  oldest age).

Counters start at zero with the process, as Prometheus's counters do; `rate()` and `increase()`
carry a restart. Labels are bounded (role, status, reason class, outcome, engine: the configured
engines' `fleet/engine` tags): never a task, run or story id.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter as Tally
from collections.abc import Mapping
from dataclasses import dataclass, field

import dagster as dg
import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..domain.models import DeliberationStatus, Role
from ..domain.scoring import ProposalScore, gate_failures
from ..events.models import DeliberationOutcome, EventEnvelope, PlanningRejected
from ..events.outbox import Outbox
from ..events.planning import refusal_class
from ..events.streams import (
    DELIBERATION_COMPLETED,
    DELIBERATION_FAILED,
    PLAN_APPROVED,
    PLANNING_REJECTED,
    NatsError,
)
from ..history.log import OUTCOME
from ..names import DECISION, DELIBERATION_JOB, SCORES, TAG_ENGINE, TAG_EVENT_SEQ
from ..resources.events import NatsResource
from ..sensors.planning import PLANNING_SENSOR, Cursor

prometheus_client.disable_created_metrics()  # no `_created` series beside each counter

CONSUMER = "fleet-metrics"
CONSUMED = (DELIBERATION_COMPLETED, DELIBERATION_FAILED, PLANNING_REJECTED)
SENSOR_TAG = "dagster/sensor_name"  # Dagster's tag on the runs a sensor started
# A deliberation's status and the class of why it ended so.
REASONS = {
    DeliberationStatus.COMPLETED: ("none",),
    DeliberationStatus.PARTIAL: ("turns_lost",),
    DeliberationStatus.TIMEOUT: ("deadline",),
    DeliberationStatus.FAILED: ("no_quorum", "run_failed"),
}
REFUSALS = (
    "too_large",
    "not_json",
    "envelope",
    "event_type",
    "unreadable",
    "duplicate_tasks",
    "unprintable",
    "invalid_field",
)
SANDBOX_STATUSES = ("passed", "failed", "error", "timeout", "not_run")
DURATION_BUCKETS = (5, 15, 30, 60, 120, 180, 300, 600, 1200, 3600)
QUEUED = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED)
IN_FLIGHT = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
RUN_STATES = {**dict.fromkeys(QUEUED, "queued"), **dict.fromkeys(IN_FLIGHT, "in_flight")}
NO_ENGINE = "none"  # the engine label of a run without the `fleet/engine` tag
ROLES = {role.value for role in Role}


def sandbox_status(check: dict) -> str | None:
    """The sandbox run behind a `tests` check (its evidence as the `scores` step stored it):
    passed, failed, error, timeout or not_run; None where nothing was run in the sandbox (the task
    has no tests, or the proposal no code)."""
    if check.get("not_run"):
        return "not_run"
    if not check.get("ran") or check.get("value") is None:
        return None
    status = str(check.get("evidence", "")).split(":", 1)[0]
    if status in ("timeout", "error"):  # the run did not finish: its status leads the evidence
        return status
    return "passed" if check["value"] == 1.0 else "failed"


def reason_class(outcome: DeliberationOutcome) -> str:
    """Why a deliberation ended with its status (a bounded label): none, turns_lost, deadline,
    no_quorum, or run_failed (the run crashed before deciding)."""
    if any(d.type == "deliberation_failed" for d in outcome.decisions):
        return "run_failed"
    return REASONS.get(DeliberationStatus(outcome.status), ("other",))[0]


class FleetMetrics:
    """The exporter's series, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.deliberations = Counter(
            "fleet_deliberations",
            "Deliberations decided or failed (one outcome event per run), by role, status, reason class.",
            ["role", "status", "reason"],
            registry=r,
        )
        self.duration = Histogram(
            "fleet_deliberation_duration_seconds",
            "Run start to outcome.",
            ["role", "status"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.planning = Counter(
            "fleet_planning_events",
            "Approved-plan events read by the planning sensor: accepted (runs started) or refused "
            "(by reason).",
            ["outcome", "reason"],
            registry=r,
        )
        self.sandbox = Counter(
            "fleet_sandbox_runs",
            "Sandbox runs of scored proposals' tests, by status (passed, failed, error, timeout, not_run).",
            ["status"],
            registry=r,
        )
        self.winners = Counter(
            "fleet_deliberation_winners",
            "Decided deliberations by whether the winner passed its hard checks (code parses, runs, "
            "its tests pass: `winner_passes_checks`), by role; passed=false also where there is no "
            "winner.",
            ["role", "passed"],
            registry=r,
        )
        self.forgeable = Counter(
            "fleet_sandbox_forgeable_results",
            "Test results the judged code could have written (they never pass the gate).",
            registry=r,
        )
        self.runs = Gauge(
            "fleet_deliberation_runs",
            "Deliberation runs queued or in flight, by engine (the runs' fleet/engine tag).",
            ["engine", "status"],
            registry=r,
        )
        self.sensor_lag = Gauge(
            "fleet_planning_sensor_lag_messages",
            "Planning-stream messages after the planning sensor's cursor.",
            registry=r,
        )
        self.sensor_stall = Gauge(
            "fleet_planning_sensor_lag_seconds",
            "How long plans have waited while the planning sensor's cursor did not move (0: none wait).",
            registry=r,
        )
        self.outbox_events = Gauge(
            "fleet_outbox_events", "Events kept in the outbox (NATS did not take them).", registry=r
        )
        self.outbox_age = Gauge(
            "fleet_outbox_oldest_age_seconds", "Age of the oldest batch in the outbox (0: empty).", registry=r
        )
        self.source_up = Gauge(
            "fleet_exporter_source_up", "Whether the last read of a source worked.", ["source"], registry=r
        )
        for role in Role:  # every series exists from the start: increase() sees the first event
            for status, reasons in REASONS.items():
                self.duration.labels(role.value, status.value)
                for reason in reasons:
                    self.deliberations.labels(role.value, status.value, reason)
        self.planning.labels("accepted", "none")
        for reason in REFUSALS:
            self.planning.labels("refused", reason)
        for status in SANDBOX_STATUSES:
            self.sandbox.labels(status)
        for role in Role:
            for passed in ("true", "false"):
                self.winners.labels(role.value, passed)
        self._engines: set[str] = set()  # engines whose runs were counted: their gauges go back to 0

    def outcome(self, outcome: DeliberationOutcome) -> None:
        role = outcome.role or "unknown"
        self.deliberations.labels(role, outcome.status, reason_class(outcome)).inc()
        self.duration.labels(role, outcome.status).observe(outcome.duration_ms / 1000)

    def refused(self, rejected: PlanningRejected) -> None:
        self.planning.labels("refused", refusal_class(rejected.reason)).inc()

    def scored(self, evidence: dict[str, list[dict]]) -> None:
        """One `scores` step's evidence: per agent, its checks."""
        for checks in evidence.values():
            for check in checks:
                if check.get("name") != "tests":
                    continue
                if (status := sandbox_status(check)) is not None:
                    self.sandbox.labels(status).inc()
                if check.get("forgeable"):
                    self.forgeable.inc()

    def decided(self, role: str | None, winner: str | None, evidence: dict[str, list[dict]] | None) -> None:
        """A run's decision: its winner against that run's `scores` evidence; `role`: its task's
        (unknown where it is not a role of the fleet)."""
        checks = (evidence or {}).get(winner or "")
        if checks is None:
            passed = False
        else:
            score = ProposalScore(agent_id=winner, score=0.0, checks=checks, requirements=[], code_blocks=0)
            passed = not gate_failures(score)
        self.winners.labels(role if role in ROLES else "unknown", str(passed).lower()).inc()

    def runs_by_engine(self, counts: Mapping[tuple[str, str], int]) -> None:
        """The runs queued and in flight, per (engine, status); an engine counted before and not
        now reads 0 (never a stale count)."""
        self._engines |= {engine for engine, _ in counts}
        for engine in self._engines:
            for status in ("queued", "in_flight"):
                self.runs.labels(engine, status).set(counts.get((engine, status), 0))


@dataclass
class _SensorWatch:
    """The planning sensor's progress as this exporter saw it."""

    seq: int | None = None
    since: float = field(default_factory=time.time)  # when the cursor last moved (or plans began to wait)


class FleetExporter:
    """Reads the durable sources every `interval_s` into `metrics` (see the module docstring)."""

    def __init__(
        self,
        metrics: FleetMetrics,
        nats: NatsResource,
        instance: dg.DagsterInstance,
        outbox: Outbox | None,
        interval_s: float = 2.0,
    ):
        self.metrics = metrics
        self.nats = nats
        self.instance = instance
        self.outbox = outbox
        self.interval_s = interval_s
        self._runs_after = time.time()  # runs the planning sensor started before this are not counted
        self._accepted: dict[str, float] = {}  # planning message (stream seq) -> when its first run was seen
        self._sensor = _SensorWatch()
        self._up: dict[str, bool] = {}  # per source, whether its last read worked
        self._after: dict[str, int] = {}  # per asset (scores, decision): the last storage id read
        self._evidence: dict[str, dict] = {}  # run id -> its scores' evidence, until its decision

    async def run(self, stop: asyncio.Event) -> None:
        from ..events.bus import connect

        session = None
        while not stop.is_set():
            try:
                if session is None:
                    session = await connect(self.nats.options())
                    await session.ensure_streams(replicas=self.nats.stream_replicas)
                    subscriptions = await self._subscribe(session)
                await self._consume(subscriptions)
                await self._sensor_lag(session)
                self._source("nats")
            except Exception as exc:  # whatever NATS or nats-py raised: said, and connected again
                self._source("nats", exc)
                if session is not None:
                    with contextlib.suppress(Exception):
                        await session.close()
                session = None
            self.read_dagster()
            self.read_outbox()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
        if session is not None:
            await session.close()

    async def _subscribe(self, session) -> list:
        """One durable pull consumer per stream that holds the consumed subjects (one, usually)."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        by_stream: dict[str, list[str]] = {}
        for subject in CONSUMED:
            by_stream.setdefault(await session.stream_for(subject), []).append(subject)
        subscriptions = []
        for stream, subjects in by_stream.items():
            config = ConsumerConfig(
                durable_name=CONSUMER,
                deliver_policy=DeliverPolicy.NEW,  # its first start counts from then on
                ack_policy=AckPolicy.EXPLICIT,
                filter_subjects=subjects,
                inactive_threshold=7 * 86_400.0,  # an exporter gone for a week leaves no consumer
            )
            try:
                await session.js.add_consumer(stream, config)
                subscriptions.append(await session.js.pull_subscribe_bind(CONSUMER, stream=stream))
            except Exception as exc:
                raise NatsError(f"consumer {CONSUMER} on {stream}: {exc}") from exc
        return subscriptions

    async def _consume(self, subscriptions: list) -> None:
        import nats.errors

        for sub in subscriptions:
            while True:
                try:
                    messages = await sub.fetch(256, timeout=0.5)
                except nats.errors.TimeoutError:
                    break
                for message in messages:
                    self.count(message.subject, message.data)
                    await message.ack()

    def count(self, subject: str, data: bytes) -> None:
        """One consumed event into the counters (one that does not parse is left uncounted)."""
        try:
            envelope = EventEnvelope.model_validate_json(data)
            if subject == PLANNING_REJECTED:
                self.metrics.refused(PlanningRejected.model_validate(envelope.payload))
            else:
                self.metrics.outcome(DeliberationOutcome.model_validate(envelope.payload))
        except ValueError as exc:
            print(f"fleet metrics: an event on {subject} does not parse: {exc}", flush=True)

    async def _sensor_lag(self, session) -> None:
        stream = await session.stream_for(PLAN_APPROVED)
        last = (await session.position(stream)).last_seq
        cursor = self._sensor_cursor()
        lag = max(last - (cursor or 0), 0)
        now = time.time()
        if lag == 0 or cursor != self._sensor.seq:
            self._sensor = _SensorWatch(seq=cursor, since=now)
        self.metrics.sensor_lag.set(lag)
        self.metrics.sensor_stall.set(now - self._sensor.since if lag else 0)

    def _sensor_cursor(self) -> int | None:
        state = next((s for s in self.instance.all_instigator_state() if s.name == PLANNING_SENSOR), None)
        cursor = Cursor.parse(state.instigator_data.cursor if state and state.instigator_data else None)
        return None if cursor is None else cursor.seq

    def read_dagster(self) -> None:
        try:
            self._accepted_events()
            self._scores()
            records = self.instance.get_run_records(
                dg.RunsFilter(job_name=DELIBERATION_JOB, statuses=list(RUN_STATES))
            )
            self.metrics.runs_by_engine(
                Tally(
                    (r.dagster_run.tags.get(TAG_ENGINE, NO_ENGINE), RUN_STATES[r.dagster_run.status])
                    for r in records
                )
            )
            self._source("dagster")
        except Exception as exc:  # the run storage is down or busy: said, and tried again
            self._source("dagster", exc)

    def _accepted_events(self) -> None:
        records = self.instance.get_run_records(
            dg.RunsFilter(
                tags={SENSOR_TAG: PLANNING_SENSOR},
                created_after=_utc(self._runs_after - 60),
            )
        )
        newest = self._runs_after
        for record in records:
            created = record.create_timestamp.timestamp()
            seq = record.dagster_run.tags.get(TAG_EVENT_SEQ)
            if created < self._runs_after - 60 or seq is None or seq in self._accepted:
                continue
            self._accepted[seq] = created
            self.metrics.planning.labels("accepted", "none").inc()
            newest = max(newest, created)
        self._runs_after = newest
        for seq in [s for s, t in self._accepted.items() if t < newest - 3_600]:
            del self._accepted[seq]  # a plan's runs are started in one tick: an hour is plenty

    def _scores(self) -> None:
        for record in self._new_materializations(SCORES):
            evidence = record.asset_materialization.metadata.get("evidence")
            if evidence is not None:
                self.metrics.scored(evidence.value)
                self._evidence[record.run_id] = evidence.value
        for record in self._new_materializations(DECISION):
            metadata = record.asset_materialization.metadata
            winner = metadata.get("winner")
            name = winner.value if winner is not None and winner.value != "none" else None
            role = metadata[OUTCOME].value.get("role") if OUTCOME in metadata else None
            self.metrics.decided(role, name, self._evidence.pop(record.run_id, None))
        while len(self._evidence) > 1_000:  # scores whose run never decided (it failed)
            del self._evidence[next(iter(self._evidence))]

    def _new_materializations(self, asset: str) -> list:
        """The materializations of `asset` stored since the last call (none before this exporter
        started: those are not counted)."""
        key = dg.AssetKey(asset)
        if asset not in self._after:
            latest = self.instance.fetch_materializations(key, limit=1).records
            self._after[asset] = latest[0].storage_id if latest else 0
        found = []
        while True:
            records = self.instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, after_storage_id=self._after[asset]),
                limit=100,
                ascending=True,
            ).records
            found += records
            if records:
                self._after[asset] = records[-1].storage_id
            if len(records) < 100:
                return found

    def read_outbox(self) -> None:
        if self.outbox is None:
            return
        try:
            batches = self.outbox.batches()
            self.metrics.outbox_events.set(
                sum(len(self.outbox.read(p).events) for p in batches if p.exists())
            )
            oldest = min((int(p.name.split(".")[0]) for p in batches), default=None)
            self.metrics.outbox_age.set(0 if oldest is None else max(time.time() - oldest / 1e9, 0.0))
            self._source("outbox")
        except (OSError, ValueError) as exc:
            self._source("outbox", exc)

    def _source(self, name: str, error: BaseException | None = None) -> None:
        """Whether a source answered this time; said in the log once when it stops or comes back."""
        up = error is None
        if self._up.get(name, True) != up:
            print(
                f"fleet metrics: {name}: {'back' if up else f'{type(error).__name__}: {error}'}", flush=True
            )
        self._up[name] = up
        self.metrics.source_up.labels(name).set(int(up))


def _utc(timestamp: float):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, UTC)


def serve(exporter: FleetExporter, host: str, port: int, stop: asyncio.Event | None = None) -> None:
    """Serves the exporter's registry on http://host:port/metrics and reads its sources until
    `stop` is set (or the process is stopped)."""
    prometheus_client.start_http_server(port, addr=host, registry=exporter.metrics.registry)
    print(f"fleet metrics: serving http://{host}:{port}/metrics", flush=True)

    async def main() -> None:
        await exporter.run(stop or asyncio.Event())

    asyncio.run(main())
