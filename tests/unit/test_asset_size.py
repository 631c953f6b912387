"""Assets stay a few lines over domain functions and `previews`: every asset body of every module
of `fleet_pipelines.assets` (its docstring aside) is at most 20 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import fleet_pipelines.assets

ASSETS = Path(fleet_pipelines.assets.__file__).parent
MAX_BODY_LINES = 20


def asset_bodies() -> dict[str, int]:
    sizes = {}
    for module in sorted(ASSETS.glob("*.py")):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).startswith(("dg.asset", "dg.multi_asset")) for d in node.decorator_list
            ):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                sizes[f"{module.stem}.{node.name}"] = body[-1].end_lineno - body[0].lineno + 1
    return sizes


def test_every_asset_body_is_at_most_20_lines():
    sizes = asset_bodies()
    every_module = {p.stem for p in ASSETS.glob("*.py")} - {"__init__", "partitions", "previews", "progress"}
    assert {name.split(".")[0] for name in sizes} == every_module  # none left unread
    assert {name: n for name, n in sizes.items() if n > MAX_BODY_LINES} == {}
