"""Agents' turns on a repository: `domain.tool_turns` with its tools run on the read-only
workspace and its answers' edits checked against the checkout's files (`view.edit_files`). The
deliberation's runner (`resources.repos`) and the evaluation's.

Reading tools (`read_file`, `search_text`, `list_files`) read the checkout's texts, held in
memory, paged (`domain.tools`): reading a file runs none of its code. `run_tests` runs in the
sandbox (`runs.run_tool`), and its output is cached per checkout (commit) in this process: the
same run on the same checkout, by any turn of the council, is served, not run again.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from ..domain.deliberation import TurnRunner
from ..domain.repomap import focus, indexed
from ..domain.tool_turns import Meter, OnStep, ToolTurns
from ..domain.tools import StepBudget, ToolProtocol, list_paths, read_text, search_texts
from ..domain.workspace import Workspace
from .runs import RepoRunLimits, run_tool
from .view import edit_files

MAX_CACHED_OUTPUTS = 512
_cache: OrderedDict[tuple[str, str, str, str], str] = OrderedDict()
_cache_lock = threading.Lock()


def cached_tool(workspace: Workspace, name: str, arguments: dict, run) -> str:
    """`run()`'s output for this call on this checkout, from the cache when a turn made it before."""
    key = (workspace.path, workspace.commit, name, json.dumps(arguments, sort_keys=True))
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    output = run()
    with _cache_lock:
        _cache[key] = output
        while len(_cache) > MAX_CACHED_OUTPUTS:
            _cache.popitem(last=False)
    return output


def repository_turns(
    run_step: TurnRunner,
    workspace: Workspace,
    protocol: ToolProtocol,
    limits: RepoRunLimits,
    budget: StepBudget,
    offer: bool = True,
    on_step: OnStep | None = None,
    on_result=None,
    meter: Meter | None = None,
    description: str = "",
    deadline: float | None = None,
) -> TurnRunner:
    """Turns on a repository (`domain.tool_turns`): tools on the read-only workspace (`offer`
    False: none offered), each answer's edits checked against the checkout's files and turned
    into its patch, and with the engine's `meter` every request fitted to its window. A `json`
    answer's edits search in the functions the task (`description`) and the failing tests name
    (`repomap.focus`; of a name defined twice, the one the failing tests ran), where they name
    any. Calls stop in time to answer before `deadline`."""
    texts = edit_files(workspace)
    base = workspace.baseline
    narrowed = (
        focus(texts, description, base.failing, base.first_failure, base.executed)
        if base
        else focus(texts, description, [], "")
    )
    paths = [f.path for f in workspace.files if indexed(f.path)]

    def execute(name: str, arguments: dict) -> str:
        if name == "read_file":
            return read_text(texts, arguments)
        if name == "search_text":
            return search_texts(texts, arguments)
        if name == "list_files":
            return list_paths(paths, arguments)
        return cached_tool(workspace, name, arguments, lambda: run_tool(workspace, name, arguments, limits))

    return ToolTurns(
        run_step,
        execute,
        budget,
        protocol=protocol,
        files=texts,
        offer=offer,
        on_step=on_step,
        on_result=on_result,
        meter=meter,
        focus=narrowed or None,
        deadline=deadline,
    )
