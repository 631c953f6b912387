"""The JetStream streams and subjects of the platform, and how init plans them beside other streams.

A server may already hold the streams of the system we replace (same names, same subjects). We
create and update only streams we created ourselves (marked by `OWNER_METADATA`); a subject that a
stream of anyone else already captures is used through that stream, which is never edited; a
stream that would overlap one of theirs is not created and is reported as a conflict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

DAY_S = 86_400.0


class NatsError(ConnectionError):
    """NATS could not be reached, stopped answering, or refused a JetStream request."""


@dataclass(frozen=True)
class StreamPosition:
    """Where a stream stands: its first and last sequence, and when it was created."""

    stream: str
    first_seq: int
    last_seq: int
    created: str


PLANNING_STREAM = "PLANNING_EVENTS"
PLAN_APPROVED = "planning.plan.approved"
PLANNING_REJECTED = "orchestration.planning.rejected"
DELIBERATION_COMPLETED = "orchestration.deliberation.completed"
DELIBERATION_FAILED = "orchestration.deliberation.failed"
# Per turn: proposals on agent.response.*, reviews on subjects of their own, so a consumer that
# counts agent responses (the old system's collector) counts proposals only.
AGENT_RESPONSE_COMPLETED = "agent.response.completed"
AGENT_RESPONSE_FAILED = "agent.response.failed"
AGENT_CRITIQUE = "agent.critique"  # .completed | .failed
AGENT_REVISION = "agent.revision"  # .completed | .failed
# What the old system's consumers read: its workers' per-agent results and its collector's summary.
AGENT_RESULTS = "agent.results"  # .{task_id}
# What the context service says of a story (read into the story's context): context.updated.{story_id}
CONTEXT_UPDATED = "context.updated"
COLLECTOR_COMPLETED = "deliberation.completed"
COLLECTOR_FAILED = "deliberation.failed"
VLLM_STREAMING = "vllm.streaming"  # .{task_id}: token chunks


def streaming_subject(task_id: str) -> str:
    """Where the token chunks of a deliberation's turns go (stream VLLM_STREAMING, 10 min)."""
    return f"{VLLM_STREAMING}.{task_id}"


# Metadata of the streams we create; a stream without it belongs to someone else.
OWNER_METADATA = {"managed-by": "fleet_pipelines"}


class StreamSpec(BaseModel):
    """What we require of one stream; other settings of an existing stream are left alone."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Stream name (the old system's where the subjects match).")
    subjects: tuple[str, ...] = Field(description="Subjects the stream captures.")
    max_age_s: float = Field(description="Retention of a message, in seconds.")
    duplicate_window_s: float = Field(
        default=600.0, description="Window in which a repeated Nats-Msg-Id is dropped, in seconds."
    )


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(name=PLANNING_STREAM, subjects=("planning.>",), max_age_s=30 * DAY_S),
    StreamSpec(name="ORCHESTRATOR_EVENTS", subjects=("orchestration.>",), max_age_s=7 * DAY_S),
    StreamSpec(name="CONTEXT_EVENTS", subjects=("context.>",), max_age_s=7 * DAY_S),
    StreamSpec(name="AGENT_RESULTS", subjects=(f"{AGENT_RESULTS}.>",), max_age_s=3_600.0),
    StreamSpec(
        name="VLLM_STREAMING", subjects=(f"{VLLM_STREAMING}.>",), max_age_s=600.0, duplicate_window_s=60.0
    ),
    StreamSpec(name="AGENT_RESPONSES", subjects=("agent.response.>",), max_age_s=1 * DAY_S),
    StreamSpec(
        name="AGENT_REVIEWS", subjects=(f"{AGENT_CRITIQUE}.>", f"{AGENT_REVISION}.>"), max_age_s=1 * DAY_S
    ),
    StreamSpec(name="DELIBERATION_RESULTS", subjects=("deliberation.>",), max_age_s=7 * DAY_S),
)


def subject_covers(wide: str, narrow: str) -> bool:
    """True when every subject that `narrow` matches is matched by `wide` (`*` and `>` wildcards)."""
    w, n = wide.split("."), narrow.split(".")
    for i, token in enumerate(w):
        if token == ">":
            return i < len(n)
        if i >= len(n) or n[i] == ">" or (token != "*" and token != n[i]):
            return False
    return len(w) == len(n)


def subjects_overlap(a: str, b: str) -> bool:
    """True when some subject is matched by both `a` and `b`."""
    ta, tb = a.split("."), b.split(".")
    for x, y in zip(ta, tb, strict=False):
        if ">" in (x, y):
            return True
        if "*" not in (x, y) and x != y:
            return False
    return len(ta) == len(tb)


class ExistingStream(BaseModel):
    """The parts of a stream on the server that the plan looks at."""

    name: str
    subjects: tuple[str, ...]
    owned: bool = Field(description="Created by this system (carries OWNER_METADATA).")
    max_age_s: float
    duplicate_window_s: float
    replicas: int


class StreamAction(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    UNCHANGED = "unchanged"
    USE = "use"  # another system's stream captures the subjects: used as it is, never edited
    CONFLICT = "conflict"  # another system's stream overlaps the subjects in part: nothing done


class StreamPlan(BaseModel):
    """What init does (or did) for one spec."""

    spec: StreamSpec
    action: StreamAction
    stream: str | None = Field(description="The stream that captures the spec's subjects, if any.")
    detail: str = Field(description="Why, in words.")


def _differences(spec: StreamSpec, current: ExistingStream, replicas: int) -> list[str]:
    wanted = {
        "subjects": (sorted(spec.subjects), sorted(current.subjects)),
        "max_age_s": (spec.max_age_s, current.max_age_s),
        "duplicate_window_s": (spec.duplicate_window_s, current.duplicate_window_s),
        "replicas": (replicas, current.replicas),
    }
    return [f"{k} {have} -> {want}" for k, (want, have) in wanted.items() if want != have]


def plan_stream(spec: StreamSpec, existing: Sequence[ExistingStream], replicas: int) -> StreamPlan:
    others = [s for s in existing if s.name != spec.name]
    same = next((s for s in existing if s.name == spec.name), None)
    if same is not None and same.owned:
        clash = [
            s.name for s in others if any(subjects_overlap(a, b) for a in spec.subjects for b in s.subjects)
        ]
        if clash:
            return StreamPlan(
                spec=spec,
                action=StreamAction.CONFLICT,
                stream=same.name,
                detail=f"its subjects overlap stream(s) {', '.join(clash)}; left as it is",
            )
        changes = _differences(spec, same, replicas)
        if changes:
            return StreamPlan(
                spec=spec, action=StreamAction.UPDATE, stream=same.name, detail="; ".join(changes)
            )
        return StreamPlan(
            spec=spec, action=StreamAction.UNCHANGED, stream=same.name, detail="ours, as specified"
        )
    for stream in ([same] if same else []) + others:
        if all(any(subject_covers(theirs, ours) for theirs in stream.subjects) for ours in spec.subjects):
            whose = "ours" if stream.owned else "not ours"
            subjects = ", ".join(spec.subjects)
            return StreamPlan(
                spec=spec,
                action=StreamAction.USE,
                stream=stream.name,
                detail=f"{subjects} already captured by {stream.name} ({whose}); used as it is",
            )
    if same is not None:
        return StreamPlan(
            spec=spec,
            action=StreamAction.CONFLICT,
            stream=None,
            detail=f"a stream named {spec.name} (not ours) captures {', '.join(same.subjects)}, "
            f"not {', '.join(spec.subjects)}; left as it is",
        )
    clash = [s.name for s in others if any(subjects_overlap(a, b) for a in spec.subjects for b in s.subjects)]
    if clash:
        return StreamPlan(
            spec=spec,
            action=StreamAction.CONFLICT,
            stream=None,
            detail=f"{', '.join(spec.subjects)} overlap(s) stream(s) {', '.join(clash)} in part; not created",
        )
    return StreamPlan(
        spec=spec,
        action=StreamAction.CREATE,
        stream=spec.name,
        detail=f"{', '.join(spec.subjects)}, {spec.max_age_s:g} s, {replicas} replica(s)",
    )


def plan_streams(
    specs: Sequence[StreamSpec], existing: Sequence[ExistingStream], replicas: int
) -> list[StreamPlan]:
    """What init does per spec; streams it plans to create count as existing for the next spec."""
    plans, seen = [], list(existing)
    for spec in specs:
        plan = plan_stream(spec, seen, replicas)
        if plan.action is StreamAction.CREATE:
            seen.append(
                ExistingStream(
                    name=spec.name,
                    subjects=spec.subjects,
                    owned=True,
                    max_age_s=spec.max_age_s,
                    duplicate_window_s=spec.duplicate_window_s,
                    replicas=replicas,
                )
            )
        plans.append(plan)
    return plans


def describe(plans: Sequence[StreamPlan], dry_run: bool) -> list[str]:
    """One line per spec for `fleet nats init`: `NAME: action [stream] (why)`."""
    lines = []
    for plan in plans:
        where = f" {plan.stream}" if plan.action is StreamAction.USE else ""
        lines.append(f"{plan.spec.name}: {plan.action.value}{where} ({plan.detail})")
    if dry_run:
        lines.append("dry run: nothing was changed")
    return lines
