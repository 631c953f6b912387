"""Parsing Python source on the host, safe from CPython 3.11's reentrant `ast.parse`.

`ast.parse` keeps one recursion counter per interpreter while it builds the tree. When the garbage
collector runs a finalizer in the middle (sqlalchemy logging a closed connection's traceback, whose
caret anchors 3.11's `traceback` finds with `ast.parse` again), the inner parse resets the counter
and the outer one raises `SystemError: AST constructor recursion depth mismatch` on valid source
(python/cpython#106905; seen on 3.11.7 in CI). With the collector off for the parse, no Python code
runs while the tree is built, so neither a finalizer nor another thread can enter it.
"""

from __future__ import annotations

import ast
import gc
from typing import TypeVar

Tree = TypeVar("Tree", ast.Module, ast.Expression)


def _without_collection(kind: type[Tree], source: str | bytes, mode: str) -> Tree:
    enabled = gc.isenabled()
    gc.disable()
    try:
        tree = ast.parse(source, mode=mode)
    finally:
        if enabled:
            gc.enable()
    assert isinstance(tree, kind)
    return tree


def parse_module(source: str | bytes) -> ast.Module:
    """The module tree of `source`; SyntaxError or ValueError as `ast.parse` raises them."""
    return _without_collection(ast.Module, source, "exec")


def parse_expression(source: str | bytes) -> ast.Expression:
    """The expression tree of `source`; SyntaxError or ValueError as `ast.parse` raises them."""
    return _without_collection(ast.Expression, source, "eval")
