"""`council.repos`: where repository tasks' workspaces live, their caps and run limits, the token of
private remotes (read from the environment only) and where winning patches are pushed."""

from __future__ import annotations

import os
from typing import Literal

import dagster as dg
from pydantic import Field

from ..domain.deliberation import TurnRunner
from ..domain.models import RepoSpec
from ..domain.tool_turns import tool_turns
from ..domain.tools import TOOLS, StepBudget
from ..domain.workspace import Workspace
from ..workspace.checkout import CheckoutLimits
from ..workspace.prepare import prepare_workspace, workspaces_root
from ..workspace.push import branch_name, push_patch
from ..workspace.runs import RepoRunLimits, run_tool
from .config import derived_config

StepBudgetConfig = derived_config(StepBudget, "StepBudgetConfig")

RepoRunLimitsConfig = derived_config(
    RepoRunLimits,
    "RepoRunLimitsConfig",
    descriptions={
        "wall_s": "Wall-clock limit of one sandboxed repository run (copy, apply, tests, ruff, "
        "hidden tests).",
        "cpu_s": "CPU-seconds limit of each process of that run.",
        "memory_mb": "Memory limit in MiB of the run's sandbox and of each process's address space.",
        "max_processes": "Process limit of the run's sandbox.",
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


class ReposConfig(dg.Config):
    """Workspaces of repository tasks (`task.repo`)."""

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
    checkout: CheckoutLimitsConfig = Field(default_factory=CheckoutLimitsConfig)
    runs: RepoRunLimitsConfig = Field(default_factory=RepoRunLimitsConfig)
    tools: bool = Field(
        default=True,
        description="Agents may call tools (list, read, search files, run the tests) while they write "
        "or revise a patch, each call in the sandbox against the read-only workspace.",
    )
    tool_protocol: Literal["text", "openai"] = Field(
        default="text",
        description="`text`: the plain-text protocol any model follows; `openai`: also offer the tools "
        "as OpenAI `tools` (an engine with tool calling: vLLM with a tool parser, llama.cpp with --jinja).",
    )
    step_budget: StepBudgetConfig = Field(
        default_factory=StepBudgetConfig, description="What one turn may spend on tools."
    )

    def tool_runner(
        self, run_step: TurnRunner, workspace: Workspace, on_step=None, on_result=None
    ) -> TurnRunner:
        """The turn runner of a repository task's agents: tools in the sandbox, within the budget."""
        limits = self.run_limits()

        def execute(name: str, arguments: dict) -> str:
            return run_tool(workspace, name, arguments, limits)

        openai_tools = [t.openai() for t in TOOLS] if self.tool_protocol == "openai" else None
        return tool_turns(
            run_step,
            execute,
            self.step_budget.to_model(),
            openai_tools=openai_tools,
            on_step=on_step,
            on_result=on_result,
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

    def push(self, workspace: Workspace, patch: str, message: str) -> str:
        """Pushes the winning patch as `fleet/{task_id}`; returns the branch ("" when no remote)."""
        if not self.push_remote:
            return ""
        push_patch(
            workspace.url, workspace.commit, patch, self.push_remote, workspace.task_id, message, self.token()
        )
        return branch_name(workspace.task_id)
