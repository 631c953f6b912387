"""The workspace of one deliberation: the safe checkout, its dependency environment and the
baseline test result, under `<root>/<task_id>/<commit>/{repo,env}`.

A re-run of the partition at the same commit reuses the checkout and the environment (built
once per workspace); the baseline runs again (it is cheap and shows the sandbox works now).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..domain.models import RepoSpec, safe_partition_key
from ..domain.workspace import Workspace
from .checkout import CheckoutLimits, checkout, make_writable
from .environment import build_environment, declared_dependencies, environment_status
from .runs import RepoRunLimits, baseline


def workspaces_root(configured: str = "") -> Path:
    """The workspaces folder: the configured one, else `<tmp>/fleet-workspaces`."""
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "fleet-workspaces"


def remove_task_workspaces(root: Path, task_id: str) -> bool:
    """Deletes a task's workspaces (every commit's checkout and environment); False: it had none."""
    folder = root / safe_partition_key(task_id)
    if not folder.is_dir():
        return False
    make_writable(folder)
    shutil.rmtree(folder)
    return True


def prepare_workspace(
    task_id: str,
    repo: RepoSpec,
    root: Path,
    limits: CheckoutLimits | None = None,
    run_limits: RepoRunLimits | None = None,
    token: str = "",
) -> Workspace:
    """Checks `repo` out under `root` (readable by the sandbox's uids), builds its environment
    once, runs the baseline tests."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    task_dir = root / task_id
    task_dir.mkdir(exist_ok=True)
    os.chmod(task_dir, 0o755)
    staging = task_dir / ".staging"
    if staging.exists():
        make_writable(staging)
        shutil.rmtree(staging)
    done = checkout(repo.url, repo.ref, staging / "repo", limits or CheckoutLimits(), token, repo.submodules)
    final = task_dir / done.commit
    project = final / "repo" / repo.subdir
    if final.exists():  # checked out before at this commit: keep that one (its env is built)
        make_writable(staging)
        shutil.rmtree(staging)
    else:
        os.chmod(staging, 0o755)
        build_environment(staging / "repo" / repo.subdir, staging / "env", repo.setup_command)
        staging.rename(final)
    workspace = Workspace(
        task_id=task_id,
        url=repo.url,
        ref=repo.ref,
        commit=done.commit,
        path=str(final / "repo"),
        env_path=str(final / "env"),
        subdir=repo.subdir,
        test_command=repo.test_command,
        files=done.index,
        file_count=len(done.files),
        total_bytes=done.total_bytes,
        skipped=done.skipped,
        dependencies=declared_dependencies(project),
        test_dependencies=(status := environment_status(final / "env"))["installed"],
        test_dependencies_error=status["error"],
        own_removed=status["own_removed"],
        generated=status["generated"],
    )
    return workspace.model_copy(update={"baseline": baseline(workspace, run_limits or RepoRunLimits())})
