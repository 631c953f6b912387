"""Host-side parsing survives a finalizer that parses too (python/cpython#106905 on 3.11.7: CI's
`test_context_budget` failed when sqlalchemy's finalizer logged a traceback mid-parse)."""

from __future__ import annotations

import ast
import gc
from collections.abc import Iterator

import pytest

from fleet_pipelines.domain.python_ast import parse_expression, parse_module
from fleet_pipelines.domain.repomap import symbols

SOURCE = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200))


class _ParsesWhenCollected:
    """Garbage in a reference cycle whose finalizer parses, as 3.11's traceback formatting does."""

    finalized = 0

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        ast.parse("value = (1 + 2) * 3\n" * 5)
        _ParsesWhenCollected.finalized += 1


@pytest.fixture
def collector_mid_parse() -> Iterator[None]:
    """Cyclic garbage with parsing finalizers and a collector that runs every few allocations."""
    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(20)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.collect()


def _garbage() -> None:
    for _ in range(3):
        _ParsesWhenCollected()


@pytest.mark.usefixtures("collector_mid_parse")
def test_a_finalizer_that_parses_never_breaks_a_parse_and_still_runs() -> None:
    before = _ParsesWhenCollected.finalized
    for _ in range(20):
        _garbage()
        assert len(parse_module(SOURCE).body) == 200
        _garbage()
        assert isinstance(parse_expression("f(1) + g(2)").body, ast.BinOp)
        _garbage()
        assert [s.name for s in symbols("pkg/big.py", SOURCE)][-1] == "f199"
    gc.collect()
    assert _ParsesWhenCollected.finalized - before == 180
    assert gc.isenabled()


def test_parse_errors_are_ast_parses_and_the_collector_is_left_as_found() -> None:
    with pytest.raises(SyntaxError):
        parse_module("def broken(:\n")
    assert gc.isenabled()
    gc.disable()
    try:
        parse_module("x = 1\n")
        assert not gc.isenabled()
    finally:
        gc.enable()
