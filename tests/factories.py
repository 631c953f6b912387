"""Values the tests share: turns, approved plans, and reading a subject back from JetStream."""

from __future__ import annotations

import json
import time
from typing import Any

from fleet_pipelines.domain.councils import Convened, CouncilSettings, convene
from fleet_pipelines.domain.limits import SandboxLimits
from fleet_pipelines.domain.models import Role, Task, TurnKind, TurnResult, TurnStatus
from fleet_pipelines.domain.scoring import ProposalScore, ScoringWeights
from fleet_pipelines.events.models import EventEnvelope
from fleet_pipelines.events.streams import PLAN_APPROVED
from fleet_pipelines.resources.events import NatsResource

APPROVED_AT = "2026-11-25T10:00:00Z"


def turn(
    agent_id: str = "agent-dev-001",
    content: str = "",
    *,
    task_id: str = "t",
    role: Role = Role.DEV,
    kind: TurnKind = TurnKind.PROPOSE,
    round: int = 0,
    status: TurnStatus = TurnStatus.COMPLETED,
    **fields: Any,
) -> TurnResult:
    """An agent's turn: by default a completed round-0 proposal of agent-dev-001."""
    return TurnResult(
        task_id=task_id,
        agent_id=agent_id,
        role=role,
        kind=kind,
        round=round,
        status=status,
        content=content,
        **fields,
    )


def council(
    task: Task | None = None, *, quorum: int | None = None, sandbox: SandboxLimits | None = None
) -> Convened:
    """A task's council as `convene` gives it with the default settings and weights; by default a
    DEV task of three agents."""
    task = task or Task(task_id="t", description="d", role=Role.DEV, num_agents=3)
    return convene(task, CouncilSettings(), ScoringWeights(), 64, sandbox or SandboxLimits(), quorum)


def scored(agent_id: str, score: float) -> ProposalScore:
    """A final proposal's score with no checks behind it."""
    return ProposalScore(agent_id=agent_id, score=score, checks=[], requirements=[], code_blocks=0)


def plan(story_id: str = "US-1", plan_id: str = "P-1", **fields: Any) -> dict:
    """An approved plan's payload in the old system's shape (one deliberation per role); a field
    given as None is left out."""
    payload = {
        "story_id": story_id,
        "plan_id": plan_id,
        "approved_by": "po",
        "roles": ["DEV"],
        "approved_at": APPROVED_AT,
        **fields,
    }
    return {k: v for k, v in payload.items() if v is not None}


def plan_envelope(key: str, payload: dict) -> EventEnvelope:
    """An approved plan as the planning service publishes it: enveloped, keyed by `key`."""
    return EventEnvelope(event_type=PLAN_APPROVED, idempotency_key=key, correlation_id=key, payload=payload)


def read_subject(nats: NatsResource, stream: str, subject: str, limit: int = 100) -> list[dict]:
    """The messages on `subject` in `stream`, oldest first, as JSON."""

    async def work(session) -> list[dict]:
        return [
            json.loads(m.data)
            async for m in session.read_after(stream, subject, 0, limit, time.monotonic() + 5)
        ]

    return nats.session(work)
