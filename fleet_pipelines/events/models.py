"""Event envelope and payloads, each with a `schema_version` (docs/design.md, NATS events).

Incoming envelopes and plans ignore unknown fields (producers may add some), but a task does not:
a field it does not know would be an instruction lost. Outgoing models are what we promise to
subscribers. Bounds come from the domain model, so an event that would make an invalid
task is rejected here with the field named.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..domain.models import Requirement, Role, Task, TurnResult

SCHEMA_VERSION = 1
PRODUCER = "fleet-pipelines"
MAX_TASKS_PER_PLAN = 50


def utc_now() -> str:
    return datetime.now(UTC).isoformat()


class EventEnvelope(BaseModel):
    """Every message on our streams. `idempotency_key` is also sent as the `Nats-Msg-Id` header."""

    model_config = ConfigDict(extra="ignore")

    event_type: str = Field(min_length=1, max_length=256, description="Subject-like event name.")
    schema_version: int = Field(
        default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION, description="Version of the envelope + payload."
    )
    idempotency_key: str = Field(min_length=1, max_length=512, description="Unique per logical event.")
    correlation_id: str = Field(min_length=1, max_length=512, description="Ties a chain of events together.")
    causation_id: str | None = Field(default=None, max_length=512, description="The event that caused it.")
    timestamp: str = Field(default_factory=utc_now, description="ISO 8601 time the event was produced.")
    producer: str = Field(default=PRODUCER, max_length=256, description="Service that produced it.")
    metadata: dict[str, str] = Field(default_factory=dict, description="Free-form string attributes.")
    payload: dict[str, Any] = Field(description="The event's payload (one of the payload models below).")

    def encoded(self) -> bytes:
        return self.model_dump_json().encode()


class LegacyEvent(BaseModel):
    """A message in the old system's own form, no envelope, for its consumers (they read the
    fields at the top level); `idempotency_key` goes only into the `Nats-Msg-Id` header."""

    idempotency_key: str = Field(min_length=1, description="Unique per logical event.")
    body: dict[str, Any] = Field(description="The message as the old system sent it.")

    def encoded(self) -> bytes:
        return json.dumps(self.body).encode()


class Publishable(Protocol):
    """What a session publishes: bytes, and the key JetStream deduplicates on."""

    idempotency_key: str

    def encoded(self) -> bytes: ...


class PlanApproved(BaseModel):
    """`planning.plan.approved`: legacy flat form or the payload of an envelope."""

    model_config = ConfigDict(extra="ignore")

    story_id: str = Field(min_length=1, max_length=256, description="Story the plan belongs to.")
    plan_id: str = Field(min_length=1, max_length=256, description="The approved plan.")
    approved_by: str = Field(max_length=256, description="Who approved it.")
    roles: list[Role] = Field(default_factory=list, max_length=len(Role), description="Councils to convene.")
    tasks: list[dict[str, Any]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_TASKS_PER_PLAN,
        description="Explicit tasks, without them one task per role. Each is the domain Task's flat "
        "form with an optional `task_id` (derived from plan, role and position when absent), or the "
        "old system's shape (`task_description`, `constraints: {rubric, requirements, metadata, "
        "max_iterations, timeout_seconds}`); fields left out take the defaults, the plan's story "
        "fields are the plan's to give. Validated once, as the Task (events/planning.py): an unknown "
        "field rejects the plan with its name, never dropped.",
    )
    story_title: str | None = Task.model_fields["story_title"]
    story_description: str | None = Task.model_fields["story_description"]
    acceptance_criteria: list[Requirement] = Task.model_fields["acceptance_criteria"]
    approved_at: str | None = Field(default=None, description="Approval time (what the planner sends).")
    timestamp: str | None = Field(default=None, description="Approval time (the seed contract's name).")

    @model_validator(mode="after")
    def _complete(self) -> PlanApproved:
        if self.approved_at is None and self.timestamp is None:
            raise ValueError("one of approved_at or timestamp is required")
        if not self.tasks and not self.roles:
            raise ValueError("roles must name at least one role when tasks are absent")
        return self


class Proposal(BaseModel):
    content: str = Field(description="The agent's text.")
    author_id: str = Field(description="Agent id.")
    author_role: str = Field(description="Agent role.")
    model: str = Field(description="Model that wrote it.")
    temperature: float = Field(description="Sampling temperature.")
    tokens: int = Field(description="Completion tokens.")

    @classmethod
    def from_turn(cls, turn: TurnResult) -> Proposal:
        return cls(
            content=turn.content,
            author_id=turn.agent_id,
            author_role=turn.role.value,
            model=turn.model,
            temperature=turn.temperature,
            tokens=turn.tokens_out,
        )


class AgentResponse(BaseModel):
    """`agent.response.completed|failed`: the seed payload plus `round`, `kind` and `target_agent_id`."""

    task_id: str = Field(description="Deliberation task id.")
    agent_id: str = Field(description="Agent id.")
    role: str = Field(description="Council role.")
    round: int = Field(description="0 for proposals, 1..R for review rounds.")
    kind: str = Field(description="propose, critique or revise.")
    target_agent_id: str | None = Field(default=None, description="For a critique: whose proposal.")
    status: str = Field(description="completed, failed or timeout.")
    duration_ms: float = Field(description="Engine time of the turn (from sending to the last token).")
    queue_ms: float = Field(default=0.0, description="Time the turn waited for a free engine slot.")
    timestamp: str = Field(default_factory=utc_now, description="ISO 8601.")
    num_agents: int = Field(description="Council size.")
    proposal: Proposal | None = Field(default=None, description="The text, when the turn completed.")
    error: str | None = Field(default=None, description="Why the turn failed.")
    error_type: str | None = Field(default=None, description="Error class of the failure.")


class TurnChunk(BaseModel):
    """`vllm.streaming.{task_id}`: a piece of a turn's text as it streams (a few per second per turn).
    Concatenating a turn's chunks by `seq` gives its text; `done` marks the last one."""

    task_id: str = Field(description="Deliberation task id.")
    run_id: str = Field(description="The Dagster run deliberating.")
    agent_id: str = Field(description="Agent id (`judge` for a judge turn).")
    kind: str = Field(description="propose, critique, revise or judge.")
    round: int = Field(description="0 for proposals, 1..R for review rounds.")
    target_agent_id: str | None = Field(
        default=None, description="For a critique or judge turn: whose proposal."
    )
    seq: int = Field(description="Chunk number within the turn, from 0.")
    text: str = Field(description="The text of this chunk.")
    tokens: int = Field(description="Streamed pieces (about one token each) in this chunk.")
    done: bool = Field(default=False, description="The turn ended: no chunk follows.")
    status: str | None = Field(default=None, description="With done: completed, failed or timeout.")


class DecisionRecord(BaseModel):
    """One entry of the context service's decision graph."""

    id: str = Field(description="Decision id.")
    type: str = Field(description="Decision type.")
    rationale: str = Field(description="Why.")
    affected_subtask: str = Field(description="Task the decision is about.")


class RankEntry(BaseModel):
    rank: int = Field(description="1 is the winner.")
    agent_id: str = Field(description="Agent id.")
    score: float = Field(description="Weighted score.")


class DeliberationOutcome(BaseModel):
    """`orchestration.deliberation.completed|failed`."""

    task_id: str = Field(description="Deliberation task id.")
    story_id: str | None = Field(description="Story from planning.")
    plan_id: str | None = Field(description="Plan from planning.")
    status: str = Field(description="COMPLETED, PARTIAL, FAILED or TIMEOUT.")
    winner_id: str | None = Field(description="Winning agent, if any.")
    ranking: list[RankEntry] = Field(description="Agents by score.")
    decisions: list[DecisionRecord] = Field(description="Decisions for the context service.")
    reasons: list[str] = Field(default_factory=list, description="Why this status and winner.")
    duration_ms: float = Field(description="Run start to decision.")
    run_id: str = Field(description="Dagster run id.")
    role: str | None = Field(default=None, description="The council's role (DEV, QA, …), where known.")
    patch: str | None = Field(
        default=None,
        description="A repository task: the winning unified diff, inline up to 16,000 characters "
        "(the whole patch: `fleet result TASK_ID --patch`).",
    )
    patch_truncated: bool = Field(default=False, description="The inline patch is cut at a line end.")
    patch_chars: int = Field(default=0, description="Length of the whole winning patch.")
    base_commit: str | None = Field(default=None, description="A repository task: the commit patched.")
    pushed_branch: str | None = Field(default=None, description="Branch the winning patch was pushed as.")


class PlanningRejected(BaseModel):
    """`orchestration.planning.rejected`: an approved-plan message we could not turn into tasks."""

    stream: str = Field(description="Stream the message came from.")
    stream_sequence: int = Field(description="Its sequence in that stream.")
    subject: str = Field(description="Its subject.")
    reason: str = Field(description="What is wrong with it, naming the field.")
    # Defaults only so that dead letters of earlier versions (which kept the whole original) load.
    original_size: int | None = Field(default=None, description="Size of the original body in bytes.")
    original_sha256: str | None = Field(default=None, description="SHA-256 of the original body (hex).")
    original_truncated: bool = Field(
        default=False,
        description="True when the original below is cut short (or left out: a minimal dead letter).",
    )
    original_text: str | None = Field(default=None, description="The original (prefix) when valid UTF-8.")
    original_base64: str | None = Field(default=None, description="The original (prefix) otherwise.")
    original_headers: dict[str, str] = Field(default_factory=dict, description="Its NATS headers.")
