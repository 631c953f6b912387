"""The `workspace` asset: a repository task's checkout at its resolved commit (read-only), its
file index, dependency environment and baseline test result. A task without a repository gets an
empty workspace, so every deliberation has the same graph."""

import dagster as dg

from ..domain.models import Task
from ..domain.workspace import Workspace
from ..names import DELIBERATION_GROUP, WORKSPACE
from ..resources.repos import ReposResource
from ..workspace.checkout import CheckoutError
from ..workspace.environment import DependencyError
from .partitions import deliberation_partitions
from .previews import workspace_metadata


@dg.asset(
    partitions_def=deliberation_partitions, group_name=DELIBERATION_GROUP, name=WORKSPACE, kinds={"git"}
)
def workspace(
    context: dg.AssetExecutionContext, deliberation_task: Task, repos: ReposResource
) -> dg.Output[Workspace]:
    """The repository the task names, checked out safely (no hook, filter or submodule runs),
    with its dependencies installed once and the baseline run of its tests in the sandbox."""
    task = deliberation_task
    if task.repo is None:
        return dg.Output(
            Workspace(task_id=task.task_id), metadata={"repository": "none (not a repository task)"}
        )
    try:
        ready = repos.prepare(task.task_id, task.repo)
    except (
        CheckoutError,
        DependencyError,
        ValueError,
    ) as exc:  # ValueError: a workspace the sandbox cannot read
        raise dg.Failure(description=f"workspace of {task.task_id}: {exc}", allow_retries=False) from exc
    status = ready.baseline.status if ready.baseline else "not run"
    context.log.info(f"{task.repo.url} {task.repo.ref} -> {ready.commit}; baseline {status}")
    return dg.Output(ready, metadata=workspace_metadata(ready))
