"""The events we publish, as (subject, event) pairs with deterministic idempotency keys.

Keys are built from the run id and the turn's identity, so a retried step republishes the same
keys and JetStream drops the copies; a new run of the same task publishes new events. Our events
are enveloped; those for the old system's consumers (`agent.results.{task_id}`,
`deliberation.completed|failed`) are in that system's own unenveloped form.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from ..domain.decision import Decision
from ..domain.models import DeliberationStatus, Task, TurnKind, TurnRequest, TurnResult, TurnStatus
from ..domain.workspace import bounded_patch
from .models import (
    AgentResponse,
    DecisionRecord,
    DeliberationOutcome,
    EventEnvelope,
    LegacyEvent,
    PlanningRejected,
    Proposal,
    RankEntry,
    TurnChunk,
)
from .streams import (
    AGENT_CRITIQUE,
    AGENT_RESULTS,
    AGENT_REVISION,
    COLLECTOR_COMPLETED,
    COLLECTOR_FAILED,
    DELIBERATION_COMPLETED,
    DELIBERATION_FAILED,
    PLANNING_REJECTED,
    streaming_subject,
)

Event = tuple[str, EventEnvelope | LegacyEvent]
# Subject prefix per turn kind (+ .completed | .failed): only proposals are agent responses.
TURN_SUBJECTS = {
    TurnKind.PROPOSE: "agent.response",
    TurnKind.CRITIQUE: AGENT_CRITIQUE,
    TurnKind.REVISE: AGENT_REVISION,
}
# AgentResponse fields the old system's workers did not send.
_OURS_ONLY = {"round", "kind", "target_agent_id", "queue_ms"}


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
    """Per turn, on its kind's subject; per proposal also `agent.results.{task_id}` as the old
    system's workers sent it (their payload, no envelope)."""
    events: list[Event] = []
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
            queue_ms=r.queue_ms,
            num_agents=task.num_agents,
            proposal=Proposal.from_turn(r) if ok else None,
            error=None if ok else r.error,
            error_type=None if ok else r.error_type,
        )
        key = f"agent.response:{turn_key(run_id, r)}"
        events.append(
            _envelope(
                f"{TURN_SUBJECTS[r.kind]}.{'completed' if ok else 'failed'}",
                key,
                payload.model_dump(mode="json"),
                correlation_id or task.task_id,
                causation_id,
            )
        )
        if r.kind is TurnKind.PROPOSE:
            body = payload.model_dump(mode="json", exclude=_OURS_ONLY, exclude_none=True)
            events.append(
                (
                    f"{AGENT_RESULTS}.{r.task_id}",
                    LegacyEvent(idempotency_key=f"agent.results:{key}", body=body),
                )
            )
    return events


def collector_event(task: Task, proposals: Sequence[TurnResult], run_id: str, duration_ms: float) -> Event:
    """`deliberation.completed|failed` as the old system's result collector sent it, from the
    round-0 proposals: completed when at least one agent answered, failed when none did."""
    now = datetime.now(UTC).isoformat()
    ok = [p for p in proposals if p.status is TurnStatus.COMPLETED]
    failed = [
        {"agent_id": p.agent_id, "error": p.error or p.status.value, "timestamp": now}
        for p in proposals
        if p.status is not TurnStatus.COMPLETED
    ]
    key = f"deliberation.collector:{run_id}"
    if not ok:
        body = {
            "task_id": task.task_id,
            "status": "failed",
            "error": "All agents failed" if proposals else "No agent answered",
            "failed_agents": failed,
            "timestamp": now,
        }
        return COLLECTOR_FAILED, LegacyEvent(idempotency_key=key, body=body)
    results = [
        {
            "agent_id": p.agent_id,
            "role": p.role.value,
            "proposal": Proposal.from_turn(p).model_dump(mode="json"),
            "duration_ms": p.latency_ms,
            "timestamp": now,
        }
        for p in ok
    ]
    body = {
        "task_id": task.task_id,
        "status": "completed",
        "results": results,
        "failed_agents": failed,
        "total_agents": task.num_agents,
        "successful_responses": len(ok),
        "failed_responses": len(failed),
        "duration_ms": int(duration_ms),
        "completed_at": now,
    }
    return COLLECTOR_COMPLETED, LegacyEvent(idempotency_key=key, body=body)


def collector_failure_event(task_id: str, run_id: str, error: str) -> Event:
    """`deliberation.failed` for a run that crashed before any proposal was collected."""
    body = {
        "task_id": task_id,
        "status": "failed",
        "error": error,
        "failed_agents": [],
        "timestamp": datetime.now(UTC).isoformat(),
    }
    return COLLECTOR_FAILED, LegacyEvent(idempotency_key=f"deliberation.collector:{run_id}", body=body)


def turn_key(run_id: str, turn: TurnRequest | TurnResult) -> str:
    """A turn's identity within a run (idempotency keys of its events)."""
    return f"{run_id}:{turn.agent_id}:{turn.kind.value}:{turn.round}:{turn.target_agent_id or '-'}"


def turn_chunk_event(
    task_id: str,
    run_id: str,
    turn: TurnRequest | TurnResult,
    seq: int,
    text: str,
    tokens: int,
    status: TurnStatus | None = None,
) -> Event:
    """One chunk of a turn on `vllm.streaming.{task_id}`; with `status` the turn's closing chunk."""
    chunk = TurnChunk(
        task_id=task_id,
        run_id=run_id,
        agent_id=turn.agent_id,
        kind=turn.kind.value,
        round=turn.round,
        target_agent_id=turn.target_agent_id,
        seq=seq,
        text=text,
        tokens=tokens,
        done=status is not None,
        status=status.value if status is not None else None,
    )
    key = f"vllm.streaming:{turn_key(run_id, turn)}:{seq}"
    return _envelope(streaming_subject(task_id), key, chunk.model_dump(mode="json"), task_id, None)


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


def decision_outcome(
    task: Task, decision: Decision, run_id: str, duration_ms: float, pushed_branch: str = ""
) -> DeliberationOutcome:
    """The decision as `orchestration.deliberation.completed|failed` tells it; a repository task's
    with its winning patch and the branch `winning_branch` pushed it as."""
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
        role=task.role.value,
        **_patch_fields(decision, pushed_branch),
    )


def _patch_fields(decision: Decision, pushed_branch: str) -> dict:
    """A repository task's winning patch as the event carries it: size-bounded inline."""
    if not decision.winner_patch:
        return {}
    inline, truncated = bounded_patch(decision.winner_patch)
    return {
        "patch": inline,
        "patch_truncated": truncated,
        "patch_chars": len(decision.winner_patch),
        "base_commit": decision.base_commit or None,
        "pushed_branch": pushed_branch or None,
    }


def outcome_events(
    task: Task,
    decision: Decision,
    proposals: Sequence[TurnResult],
    run_id: str,
    duration_ms: float,
    correlation_id: str | None = None,
    causation_id: str | None = None,
    pushed_branch: str = "",
) -> list[Event]:
    """What a decided run tells: `orchestration.deliberation.completed|failed` and the old
    collector's `deliberation.completed|failed` from the proposals."""
    outcome = decision_outcome(task, decision, run_id, duration_ms, pushed_branch)
    return [
        deliberation_outcome_event(outcome, correlation_id, causation_id),
        collector_event(task, proposals, run_id, duration_ms),
    ]


def rejected_event(rejected: PlanningRejected) -> Event:
    """Keyed by stream, sequence and body hash: the same message is dead-lettered once, and a new
    message at the same sequence of a recreated stream gets its own dead letter."""
    digest = (rejected.original_sha256 or "-")[:16]
    key = f"planning.rejected:{rejected.stream}:{rejected.stream_sequence}:{digest}"
    return _envelope(PLANNING_REJECTED, key, rejected.model_dump(mode="json"), key, None)
