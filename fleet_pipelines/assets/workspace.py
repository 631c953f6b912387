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
from .previews import table


def baseline_md(workspace: Workspace) -> str:
    base = workspace.baseline
    if base is None:
        return "_no baseline_"
    counts = f"{base.passed} passed, {base.failed} failing, {base.skipped} skipped" if base.counted else ""
    lines = [f"**{base.status}** {counts} — `{base.ran}` ({base.duration_s:.2f} s)"]
    if base.failing:
        lines.append("Failing: " + ", ".join(f"`{f}`" for f in base.failing))
    if base.first_failure:
        lines.append(f"```\n{base.first_failure}\n```")
    return "\n\n".join(lines)


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
    rows = [f.model_dump() for f in ready.files]
    return dg.Output(
        ready,
        metadata={
            "repository": ready.url,
            "ref": ready.ref,
            "commit": ready.commit,
            "files": ready.file_count,
            "bytes": ready.total_bytes,
            "file_index": table(rows, ["path", "size", "language"]),
            "baseline": dg.MetadataValue.md(baseline_md(ready)),
            "skipped": dg.MetadataValue.md("\n".join(f"- {s}" for s in ready.skipped) or "_nothing_"),
            "dependencies": dg.MetadataValue.md(
                "\n".join(f"- `{d}`" for d in ready.dependencies) or "_none_"
            ),
            "path": dg.MetadataValue.path(ready.path),
        },
    )
