"""A task's status and results as `fleet result` prints them, and the quick answers without Dagster.

`stored_result` answers from storage (about a third of a second for the whole command, where
loading a Dagster instance alone takes longer): when the task's stored decision was written by
the run that also stored its task (the first asset of every run), that run is the task's latest
started run and it has decided. `undecided_result` answers a task that has not decided from its
latest run's status and whether its partition exists (read from the instance's tables by
history/run_index.py, or asked of Dagster by history/results.py): PENDING, IN_PROGRESS or
NOT_FOUND. Anything else (a run that ended without a stored decision, a partition removed by
retention) goes to the full lookup, history/results.py.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from ..domain.decision import Decision
from ..domain.workspace import PushedBranch
from ..names import DECISION, DELIBERATION_ASSETS, DELIBERATION_TASK, WINNING_BRANCH
from .stored import read_stored_entry, stored_run_id


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
# Dagster run statuses (DagsterRunStatus values) of a run that has not started its steps yet.
WAITING_RUN = {"QUEUED", "NOT_STARTED", "STARTING"}
GOING_RUN = "STARTED"


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
    pushed_branch: str | None = Field(
        default=None, description="A repository task: the branch the winning patch was pushed as."
    )
    events_pending: int = Field(
        default=0, description="Events of the run kept while NATS was unreachable, not yet published."
    )


def pushed_branch(base_path: str, task_id: str, run_id: str) -> str | None:
    """The branch `winning_branch` stored for the run (None: not pushed, or not by this run)."""
    stored = read_stored_entry(base_path, WINNING_BRANCH, task_id)
    if stored is None or stored[1] != run_id or not isinstance(stored[0], PushedBranch):
        return None
    return stored[0].branch or None


def from_decision(task_id: str, run_id: str, decision: Decision, branch: str | None = None) -> TaskResult:
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
        pushed_branch=branch,
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
    return from_decision(task_id, run_id, decision, pushed_branch(base_path, task_id, run_id))


def undecided_result(
    base_path: str,
    task_id: str,
    latest_run: tuple[str, str] | None,
    partition_added: bool,
    find_in_stream: Callable[[str], int | None],
) -> TaskResult | None:
    """The answer for a task with no decision of its latest run: `latest_run` is (run id, Dagster
    run status) of the task's newest deliberation run, `partition_added` whether its partition
    exists, `find_in_stream(task_id)` the planning stream sequence of an approved plan not yet
    processed. PENDING (a run waiting to start, a partition with no run, a plan in the stream),
    IN_PROGRESS (a run going that has not stored its decision) or NOT_FOUND; None when the run has
    ended or has stored its decision: only the Dagster instance knows more (history/results.py)."""
    if latest_run is not None:
        run_id, status = latest_run
        if status in WAITING_RUN:
            return TaskResult(
                task_id=task_id,
                status=TaskStatus.PENDING,
                detail=f"run {run_id} {status}",
                source="live",
                run_id=run_id,
            )
        if status != GOING_RUN or stored_run_id(base_path, DECISION, task_id) == run_id:
            return None
        done = [asset for asset in DELIBERATION_ASSETS if stored_run_id(base_path, asset, task_id) == run_id]
        return TaskResult(
            task_id=task_id,
            status=TaskStatus.IN_PROGRESS,
            detail=f"run {run_id} {status}; stored: {', '.join(done) or 'nothing yet'}",
            source="live",
            run_id=run_id,
        )
    if partition_added:
        return TaskResult(
            task_id=task_id, status=TaskStatus.PENDING, detail="partition added, no run yet", source="live"
        )
    seq = find_in_stream(task_id)
    if seq is not None:
        return TaskResult(
            task_id=task_id,
            status=TaskStatus.PENDING,
            detail=f"approved plan accepted (planning stream seq {seq}), waiting for the planning sensor",
            source="planning_stream",
        )
    return TaskResult(
        task_id=task_id,
        status=TaskStatus.NOT_FOUND,
        detail="no run, partition or planning event",
        source="none",
    )
