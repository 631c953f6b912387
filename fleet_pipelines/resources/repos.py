"""The `repos` resource: where repository tasks' workspaces live, their caps and run limits, the
token of private remotes (read from the environment only), where winning patches are pushed, and
the tools agents call on them. Its own resource (it was `council.repos`): a repository's settings
are not the council's sampling."""

from __future__ import annotations

import os

import dagster as dg
from pydantic import Field

from ..domain.deliberation import TurnRunner
from ..domain.models import RepoSpec
from ..domain.tool_turns import Meter
from ..domain.tools import StepBudget, ToolProtocol
from ..domain.workspace import PushedBranch, Workspace
from ..workspace.checkout import CheckoutError, CheckoutLimits
from ..workspace.prepare import prepare_workspace, workspaces_root
from ..workspace.push import branch_name, push_patch
from ..workspace.runs import RepoRunLimits
from ..workspace.turns import repository_turns
from .config import derived_config

StepBudgetConfig = derived_config(StepBudget, "StepBudgetConfig")

RepoRunLimitsConfig = derived_config(
    RepoRunLimits,
    "RepoRunLimitsConfig",
    descriptions={
        "wall_s": "Wall-clock limit of one sandboxed repository run (copy, apply, tests, ruff, "
        "hidden tests).",
        "cpu_s": "CPU-seconds limit of each process of that run.",
        "memory_mb": "Memory limit in MiB of the run's sandbox (the sandbox's memory_mb).",
        "max_processes": "Process limit of the run's sandbox, threads included.",
        "max_file_mb": "Largest file the run may write, MiB.",
        "max_output_chars": "Output kept from the run (its report included).",
        "work_dir_mb": "Size in MiB of the run's tmpfs work dir (the repository's copy lives there).",
        "cpus": "CPU bandwidth of the run's sandbox in cores (its cgroup).",
        "command_timeout_s": "Time limit of each command of the run (the test command, hidden tests).",
    },
)
CheckoutLimitsConfig = derived_config(
    CheckoutLimits,
    "CheckoutLimitsConfig",
    descriptions={
        "max_file_bytes": "Files larger than this are left out of the checkout (and listed).",
        "max_repo_bytes": "A repository whose files take more is refused.",
        "max_files": "A repository with more files is refused.",
    },
)


class ReposResource(dg.ConfigurableResource):
    """Workspaces of repository tasks (`task.repo`), the tools agents call on them, and the push
    of a winning patch."""

    root: str = Field(
        default="",
        description="Folder of the read-only workspaces, `<root>/<task_id>/<commit>/{repo,env}` "
        "(FLEET_WORKSPACES_DIR; default `<tmp>/fleet-workspaces`). Every folder above it must be "
        "traversable by other users: the sandbox's uids read it.",
    )
    token_env: str = Field(
        default="FLEET_GIT_TOKEN",
        description="Environment variable holding the token of private https remotes (never run config).",
    )
    push_remote: str = Field(
        default="",
        description="Git URL or path the winning patch is pushed to as branch `fleet/{task_id}` "
        "(FLEET_PUSH_REMOTE); empty: no push.",
    )
    checkout: CheckoutLimitsConfig = Field(
        default_factory=CheckoutLimitsConfig, description="What a checkout may hold."
    )
    runs: RepoRunLimitsConfig = Field(
        default_factory=RepoRunLimitsConfig, description="Limits of one sandboxed repository run."
    )
    tools: bool = Field(
        default=True,
        description="Agents may call tools (read, search files, run the tests) while they write or "
        "revise a patch, each call in the sandbox against the read-only workspace. Off: their edits "
        "are still checked and turned into the patch.",
    )
    step_budget: StepBudgetConfig = Field(
        default_factory=StepBudgetConfig,
        description="What one turn may spend on tools (a failed edit answered counts as a call).",
    )

    def tool_runner(
        self,
        run_step: TurnRunner,
        workspace: Workspace,
        protocol: ToolProtocol,
        on_step=None,
        on_result=None,
        meter: Meter | None = None,
        description: str = "",
        deadline: float | None = None,
    ) -> TurnRunner:
        """The turn runner of a repository task's agents: tools on the read-only checkout within
        the budget, in the engine's `protocol`, their edits checked against the checkout's files,
        with the engine's `meter` every request fitted to its window, and answers narrowed to where
        the task's `description` and the failing tests point; calls stop in time to answer before
        the deliberation's `deadline`."""
        return repository_turns(
            run_step,
            workspace,
            protocol,
            self.run_limits(),
            self.step_budget.to_model(),
            offer=self.tools,
            on_step=on_step,
            on_result=on_result,
            meter=meter,
            description=description,
            deadline=deadline,
        )

    def token(self) -> str:
        return os.environ.get(self.token_env, "")

    def run_limits(self) -> RepoRunLimits:
        return self.runs.to_model()

    def prepare(self, task_id: str, repo: RepoSpec) -> Workspace:
        root = workspaces_root(self.root)
        return prepare_workspace(
            task_id, repo, root, self.checkout.to_model(), self.run_limits(), self.token()
        )

    def push(self, workspace: Workspace, patch: str, message: str) -> PushedBranch:
        """Pushes the winning patch as `fleet/{task_id}` (nothing without a remote); a failed
        push is said in the result, never raised."""
        if not self.push_remote or not patch.strip():
            return PushedBranch()
        try:
            commit = push_patch(
                workspace.url,
                workspace.commit,
                patch,
                self.push_remote,
                workspace.task_id,
                message,
                self.token(),
            )
        except CheckoutError as exc:
            return PushedBranch(remote=self.push_remote, error=str(exc)[:300])
        return PushedBranch(branch=branch_name(workspace.task_id), commit=commit, remote=self.push_remote)
