"""The JetStream streams and subjects of the platform (DESIGN.md section 5)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DAY_S = 86_400.0

PLANNING_STREAM = "PLANNING_EVENTS"
PLAN_APPROVED = "planning.plan.approved"
PLANNING_REJECTED = "orchestration.planning.rejected"
AGENT_RESPONSE_COMPLETED = "agent.response.completed"
AGENT_RESPONSE_FAILED = "agent.response.failed"
DELIBERATION_COMPLETED = "orchestration.deliberation.completed"
DELIBERATION_FAILED = "orchestration.deliberation.failed"


class StreamSpec(BaseModel):
    """What we require of one stream; other settings of an existing stream are left alone."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Stream name.")
    subjects: tuple[str, ...] = Field(description="Subjects the stream captures.")
    max_age_s: float = Field(description="Retention of a message, in seconds.")
    duplicate_window_s: float = Field(
        default=600.0, description="Window in which a repeated Nats-Msg-Id is dropped, in seconds."
    )


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(name=PLANNING_STREAM, subjects=("planning.>",), max_age_s=30 * DAY_S),
    StreamSpec(name="ORCHESTRATOR_EVENTS", subjects=("orchestration.>",), max_age_s=7 * DAY_S),
    StreamSpec(name="AGENT_RESPONSES", subjects=("agent.response.>",), max_age_s=1 * DAY_S),
    StreamSpec(name="CONTEXT", subjects=("context.>",), max_age_s=7 * DAY_S),
)
