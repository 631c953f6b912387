"""The package's imports, walked from the source (every import: module level, in functions, and
under TYPE_CHECKING): no module depends on itself through others, and no layer imports one above it.

Layers, bottom up: names; the pure domain; the adapters (engines, the sandbox, the linter, events,
history, Dagster's private APIs, the running local stack's record); dispatch, the workspace and scoring
(its patch checks run in the workspace); resources; evaluation (its config derives from the resources'
nested configs); settings (which builds the resources); assets; sensors and
schedules, and the metrics exporter (it reads the planning sensor's cursor); and the entry points
(definitions, the CLI, the local stack).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import fleet_pipelines

PACKAGE = Path(fleet_pipelines.__file__).parent
LAYERS = [
    {"names"},
    {"domain"},
    {"llm", "sandbox", "linter", "events", "history", "dagster_private", "stack_file"},
    {"dispatch", "workspace", "scoring"},
    {"resources"},
    {"evaluation"},
    {"settings"},
    {"assets"},
    {"sensors", "schedules", "metrics"},
    {"definitions", "wiring", "cli", "stack"},
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once for the checks below (read, never changed)."""
    return ast.parse(path.read_text())


def imported(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The package's modules that `name` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join([*base, node.module] if node.module else base)
            submodules = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known]
            # `from . import cgroups` imports the submodule, not the names its package exports
            targets = submodules if len(submodules) == len(node.names) else [source, *submodules]
        else:
            continue
        yield from (t for t in targets if t in known and t != name)


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: set(imported(name, path, set(found))) for name, path in found.items()}


def layer(module: str) -> int | None:
    parts = module.split(".")
    return RANK.get(parts[1]) if len(parts) > 1 else None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_module_of_the_package_has_a_layer():
    missing = sorted(m for m in modules() if m != "fleet_pipelines" and layer(m) is None)
    assert not missing, f"modules with no layer in LAYERS: {missing}"


def test_no_module_depends_on_itself_through_others():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_layer_imports_a_layer_above_it():
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in graph().items()
        for target in targets
        if layer(source) is not None and layer(target) is not None and layer(target) > layer(source)
    )
    assert not upward, "imports up a layer: " + "; ".join(upward)


def test_the_walk_sees_a_cycle_and_an_upward_import():
    """The checks above would catch what they are for."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    edges = set(imported("fleet_pipelines.history.log", PACKAGE / "history" / "log.py", set(modules())))
    assert "fleet_pipelines.names" in edges and layer("fleet_pipelines.assets.story") > layer(
        "fleet_pipelines.history.log"
    )


FRAMEWORKS = {"dagster", "ray", "nats", "openai", "httpx", "aiohttp", "requests", "vllm", "pandas"}
PURE = ("fleet_pipelines.domain", "fleet_pipelines.evaluation.arms")
"""Pure logic (docs/design.md, Layout): no framework, engine client or I/O library, and of the
package only other pure modules and names."""


def outside_imports(path: Path) -> set[str]:
    """The top-level names of what `path` imports from outside the package."""
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_pure_modules_import_no_framework_and_nothing_impure():
    edges, found = graph(), modules()
    pure = {m for m in found if m.startswith(PURE)}
    assert "fleet_pipelines.evaluation.arms" in pure and "fleet_pipelines.domain.councils" in pure
    impure = sorted(
        f"{m} -> {target}"
        for m in pure
        for target in edges[m] | (outside_imports(found[m]) & FRAMEWORKS)
        if target in FRAMEWORKS or (target not in pure and target != "fleet_pipelines.names")
    )
    assert not impure, "pure modules importing frameworks or impure modules: " + "; ".join(impure)
