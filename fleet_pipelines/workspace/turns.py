"""Agents' turns on a repository: `domain.tool_turns` with its tools run in the sandbox against the
read-only workspace (`runs.run_tool`) and its answers' edits checked against the checkout's files
(`view.edit_files`). The deliberation's runner (`resources.repos`) and the evaluation's."""

from __future__ import annotations

from ..domain.deliberation import TurnRunner
from ..domain.tool_turns import OnStep, tool_turns
from ..domain.tools import StepBudget, ToolProtocol
from ..domain.workspace import Workspace
from .runs import RepoRunLimits, run_tool
from .view import edit_files


def repository_turns(
    run_step: TurnRunner,
    workspace: Workspace,
    protocol: ToolProtocol,
    limits: RepoRunLimits,
    budget: StepBudget,
    offer: bool = True,
    on_step: OnStep | None = None,
    on_result=None,
) -> TurnRunner:
    """Turns on a repository (`domain.tool_turns`): tools run in the sandbox against the
    read-only workspace (`offer` False: none offered), and each answer's edits checked against the
    checkout's files and turned into its patch."""

    def execute(name: str, arguments: dict) -> str:
        return run_tool(workspace, name, arguments, limits)

    return tool_turns(
        run_step,
        execute,
        budget,
        protocol=protocol,
        files=edit_files(workspace),
        offer=offer,
        on_step=on_step,
        on_result=on_result,
    )
