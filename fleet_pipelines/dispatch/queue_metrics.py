"""What an engine's admission queue records, through Ray's metrics API (`ray.util.metrics`).

The queue actor is long-lived (one per engine on the cluster), so its figures outlive every run:
Ray's metrics agent on the actor's node serves them on the node's `--metrics-export-port`, with
Ray's `ray_` prefix (`ray_fleet_engine_turns_total`). Labels are bounded: the engine (where it
is, as the queue names it), its model, the turn kind and the outcome status; never a task, run
or turn id. Outside a Ray worker the calls record nothing (the unit tests' queues).

Ray's histograms count every observation into the right bucket; their `_sum` is built from the
buckets' midpoints, so a mean from it is approximate (use quantiles of the buckets).
"""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge, Histogram

from ..domain.models import TurnKind, TurnResult

# Seconds: from a fraction of a second (a slot free at once) to a deliberation's deadline.
WAIT_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
SERVICE_BUCKETS = [0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320]
ENGINE = ("engine", "model")
TURN = (*ENGINE, "kind")


class QueueMetrics:
    """The series of one engine's queue (`engine`, `model` fixed for its life)."""

    def __init__(self, engine: str, model: str):
        self.labels = {"engine": engine, "model": model}
        self.waiting = Gauge(
            "fleet_engine_queue_waiting", description="Turns waiting for an engine slot.", tag_keys=ENGINE
        )
        self.in_use = Gauge(
            "fleet_engine_slots_in_use", description="Engine slots decoding a turn.", tag_keys=ENGINE
        )
        self.slots = Gauge("fleet_engine_slots", description="Engine slots (capacity).", tag_keys=ENGINE)
        self.admitted = Counter(
            "fleet_engine_turns_admitted", description="Turns granted a slot and sent.", tag_keys=TURN
        )
        self.refused = Counter(
            "fleet_engine_turns_refused",
            description="Turns never sent: no slot before their deadline.",
            tag_keys=TURN,
        )
        self.turns = Counter(
            "fleet_engine_turns",
            description="Turns ended, by status (completed, failed, timeout).",
            tag_keys=(*TURN, "status"),
        )
        self.tokens = Counter(
            "fleet_engine_tokens",
            description="Tokens of ended turns: prompt and completion.",
            tag_keys=(*TURN, "type"),
        )
        self.wait_s = Histogram(
            "fleet_engine_wait_seconds",
            description="Time a turn waited for a slot.",
            boundaries=WAIT_BUCKETS,
            tag_keys=TURN,
        )
        self.service_s = Histogram(
            "fleet_engine_service_seconds",
            description="Time the engine spent on a turn (sent to last token).",
            boundaries=SERVICE_BUCKETS,
            tag_keys=(*TURN, "status"),
        )

    def state(self, capacity: int, running: int, waiting: int) -> None:
        self.slots.set(capacity, tags=self.labels)
        self.in_use.set(running, tags=self.labels)
        self.waiting.set(waiting, tags=self.labels)

    def admitted_turn(self, kind: TurnKind, waited_s: float) -> None:
        tags = {**self.labels, "kind": kind.value}
        self.admitted.inc(1, tags=tags)
        self.wait_s.observe(waited_s, tags=tags)

    def refused_turn(self, kind: TurnKind) -> None:
        self.refused.inc(1, tags={**self.labels, "kind": kind.value})

    def ended(self, result: TurnResult) -> None:
        """A turn that was sent ended (a refused one is counted by `refused_turn` only)."""
        tags = {**self.labels, "kind": result.kind.value}
        status = {**tags, "status": result.status.value}
        self.turns.inc(1, tags=status)
        self.service_s.observe(result.latency_ms / 1000, tags=status)
        if result.tokens_in:
            self.tokens.inc(result.tokens_in, tags={**tags, "type": "prompt"})
        if result.tokens_out:
            self.tokens.inc(result.tokens_out, tags={**tags, "type": "completion"})
