"""A task's status and results as `fleet result` prints them, and the quick answer from storage.

`stored_result` answers without Dagster (about a third of a second for the whole command, where
loading a Dagster instance alone takes longer): when the task's stored decision was written by
the run that also stored its task (the first asset of every run), that run is the task's latest
started run and it has decided. Anything else (no decision yet, a newer run going, a retried run,
a partition removed by retention) goes to the full lookup, history/results.py.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from ..domain.decision import Decision
from ..names import DECISION, DELIBERATION_TASK
from .stored import read_stored_entry


class TaskStatus(StrEnum):
    PENDING = "PENDING"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    PARTIAL = "PARTIAL"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NOT_FOUND = "NOT_FOUND"


Source = Literal["live", "decision_log", "planning_stream", "none"]
TERMINAL = {TaskStatus.COMPLETED, TaskStatus.PARTIAL, TaskStatus.FAILED, TaskStatus.TIMEOUT}


class TaskResult(BaseModel):
    task_id: str = Field(description="The task (partition key).")
    status: TaskStatus = Field(description="Where the task stands.")
    detail: str = Field(description="What the status is based on.")
    source: Source = Field(
        description="What answered: the live partition (its runs and stored values), the decision "
        "log (the partition was removed by retention), the planning stream, or nothing."
    )
    run_id: str | None = Field(default=None, description="Latest deliberation run of the task.")
    winner_id: str | None = Field(default=None, description="Winning agent.")
    ranking: list[dict] = Field(default_factory=list, description="Agents by score.")
    reasons: list[str] = Field(default_factory=list, description="Why this status and winner.")
    winner_content: str | None = Field(default=None, description="The winning proposal.")
    winner_patch: str | None = Field(default=None, description="A repository task: the winning unified diff.")
    events_pending: int = Field(
        default=0, description="Events of the run kept while NATS was unreachable, not yet published."
    )


def from_decision(task_id: str, run_id: str, decision: Decision) -> TaskResult:
    return TaskResult(
        task_id=task_id,
        status=TaskStatus(decision.status.value),
        detail=f"decision of run {run_id}",
        source="live",
        run_id=run_id,
        winner_id=decision.winner_id,
        ranking=[r.model_dump() for r in decision.ranking],
        reasons=decision.reasons,
        winner_content=decision.winner_content or None,
        winner_patch=decision.winner_patch or None,
    )


def stored_result(base_path: str, task_id: str) -> TaskResult | None:
    """The task's decision from storage when its latest started run stored it, else None."""
    decided = read_stored_entry(base_path, DECISION, task_id)
    if decided is None:
        return None
    decision, run_id = decided
    started = read_stored_entry(base_path, DELIBERATION_TASK, task_id)
    if run_id is None or started is None or started[1] != run_id or not isinstance(decision, Decision):
        return None
    return from_decision(task_id, run_id, decision)
