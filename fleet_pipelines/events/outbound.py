"""The events we publish, as (subject, envelope) pairs with deterministic idempotency keys.

Keys are built from the run id and the turn's identity, so a retried step republishes the same
keys and JetStream drops the copies; a new run of the same task publishes new events.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..domain.decision import Decision
from ..domain.models import DeliberationStatus, Task, TurnResult, TurnStatus
from .models import (
    AgentResponse,
    DecisionRecord,
    DeliberationOutcome,
    EventEnvelope,
    PlanningRejected,
    Proposal,
    RankEntry,
)
from .streams import (
    AGENT_RESPONSE_COMPLETED,
    AGENT_RESPONSE_FAILED,
    DELIBERATION_COMPLETED,
    DELIBERATION_FAILED,
    PLANNING_REJECTED,
)

Event = tuple[str, EventEnvelope]


def _envelope(subject: str, key: str, payload: dict, correlation_id: str, causation_id: str | None) -> Event:
    return subject, EventEnvelope(
        event_type=subject,
        idempotency_key=key,
        correlation_id=correlation_id,
        causation_id=causation_id,
        payload=payload,
    )


def agent_response_events(
    task: Task,
    results: Sequence[TurnResult],
    run_id: str,
    correlation_id: str | None = None,
    causation_id: str | None = None,
) -> list[Event]:
    events = []
    for r in results:
        ok = r.status is TurnStatus.COMPLETED
        payload = AgentResponse(
            task_id=r.task_id,
            agent_id=r.agent_id,
            role=r.role.value,
            round=r.round,
            kind=r.kind.value,
            target_agent_id=r.target_agent_id,
            status=r.status.value,
            duration_ms=r.latency_ms,
            num_agents=task.num_agents,
            proposal=Proposal(
                content=r.content,
                author_id=r.agent_id,
                author_role=r.role.value,
                model=r.model,
                temperature=r.temperature,
                tokens=r.tokens_out,
            )
            if ok
            else None,
            error=None if ok else r.error,
            error_type=None if ok else r.error_type,
        )
        key = f"agent.response:{run_id}:{r.agent_id}:{r.kind.value}:{r.round}:{r.target_agent_id or '-'}"
        events.append(
            _envelope(
                AGENT_RESPONSE_COMPLETED if ok else AGENT_RESPONSE_FAILED,
                key,
                payload.model_dump(mode="json"),
                correlation_id or task.task_id,
                causation_id,
            )
        )
    return events


def outcome_key(run_id: str) -> str:
    """One outcome per run: the decision and the run-failure sensor share it, so only one survives."""
    return f"deliberation.outcome:{run_id}"


def deliberation_outcome_event(
    outcome: DeliberationOutcome, correlation_id: str | None = None, causation_id: str | None = None
) -> Event:
    ok = outcome.status in (DeliberationStatus.COMPLETED, DeliberationStatus.PARTIAL)
    return _envelope(
        DELIBERATION_COMPLETED if ok else DELIBERATION_FAILED,
        outcome_key(outcome.run_id),
        outcome.model_dump(mode="json"),
        correlation_id or outcome.task_id,
        causation_id,
    )


def decision_outcome(task: Task, decision: Decision, run_id: str, duration_ms: float) -> DeliberationOutcome:
    rationale = "; ".join(decision.reasons) or decision.status.value
    return DeliberationOutcome(
        task_id=task.task_id,
        story_id=task.story_id,
        plan_id=task.plan_id,
        status=decision.status.value,
        winner_id=decision.winner_id,
        ranking=[RankEntry(**r.model_dump()) for r in decision.ranking],
        decisions=[
            DecisionRecord(
                id=f"{task.task_id}:{run_id}:winner",
                type="deliberation_winner" if decision.winner_id else "deliberation_no_winner",
                rationale=rationale,
                affected_subtask=task.task_id,
            )
        ],
        reasons=decision.reasons,
        duration_ms=duration_ms,
        run_id=run_id,
    )


def rejected_event(rejected: PlanningRejected) -> Event:
    key = f"planning.rejected:{rejected.stream}:{rejected.stream_sequence}"
    return _envelope(PLANNING_REJECTED, key, rejected.model_dump(mode="json"), key, None)
