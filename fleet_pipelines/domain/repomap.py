"""Where an agent starts on a repository: the file index without what no one edits, the code's
symbols (functions and classes with their lines), and a repository map ranked by relevance to the
task and capped at a token budget, as Aider's repository map is, seeded from the failing tests
(their names and the files and functions their tracebacks pass through), as Agentless localises,
and from the lines those tests executed on the base commit (`executed_ranges`), as AutoCodeRover's
spectrum-based localisation uses them: of two functions of one name (an `if`/`else` pair), the
one the failing tests ran.

Pure: the texts are read elsewhere (`workspace.view`); the token count is given (the engine's own
tokenizer where it is known, else `approx_tokens`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from .edits import found_once
from .python_ast import parse_module
from .workspace import FailToPass, is_test_path

NOT_EDITED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "build",
        "dist",
        ".eggs",
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".tox",
        ".nox",
        ".venv",
        "venv",
        "node_modules",
        "site-packages",
        "vendor",
        "vendored",
        "_vendor",
        "third_party",
    }
)
NOT_EDITED_SUFFIXES = (".egg-info", ".dist-info")

Count = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """A conservative token count for when the engine's is not at hand: a token per 3
    characters (SmolLM2's tokenizer gives about 3.5 on Python source)."""
    return len(text) // 3 + 1


def indexed(path: str) -> bool:
    """Whether the file is one an agent may be shown: not in version control's, build, packaging,
    cache or vendored folders."""
    parts = PurePosixPath(path).parts[:-1]
    return not any(p in NOT_EDITED_DIRS or p.endswith(NOT_EDITED_SUFFIXES) for p in parts)


@dataclass(frozen=True)
class Symbol:
    path: str
    name: str
    kind: str  # "def" or "class"
    first: int  # first line (its decorators included)
    last: int
    signature: str  # the def or class line

    def line(self) -> str:
        return f"{self.signature} [lines {self.first}-{self.last}]"


_DEF = re.compile(r"^\s*(?:async\s+)?(def|class)\s+(\w+)")


def symbols(path: str, text: str) -> list[Symbol]:
    """The functions and classes of a Python file (methods too), in order of their lines; none for
    another language or a file that does not parse."""
    if not path.endswith((".py", ".pyi")):
        return []
    try:
        tree = parse_module(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            kind = "class" if isinstance(node, ast.ClassDef) else "def"
            signature = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else node.name
            found.append(Symbol(path, node.name, kind, first, node.end_lineno or node.lineno, signature))
    return sorted(found, key=lambda s: s.first)


def find_symbol(path: str, text: str, name: str) -> Symbol | None:
    """The function or class `name` (or `Class.method`) in the file, else None."""
    wanted = name.split(".")[-1].strip()
    found = [s for s in symbols(path, text) if s.name == wanted]
    if not found and not path.endswith((".py", ".pyi")):  # other languages: the def/class line
        for number, line in enumerate(text.splitlines(), 1):
            match = _DEF.match(line)
            if match and match.group(2) == wanted:
                return Symbol(path, wanted, match.group(1), number, number, line.strip())
    return found[0] if found else None


_FRAME = re.compile(
    r'(?:File "(?:/work/repo/)?([^"]+\.py)", line \d+, in (\w+))|(?:^([\w./-]+\.py):\d+: in (\w+))', re.M
)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


Ranges = Sequence[tuple[int, int]]  # lines, first to last
Executed = Mapping[str, Mapping[str, Ranges]]  # failing test id -> path -> the ranges it ran

MAX_EXECUTED_FILES = 100  # per test
MAX_EXECUTED_RANGES = 2_000  # in all


def _ranges(numbers: Iterable[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for n in sorted({int(n) for n in numbers if int(n) > 0}):
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], n)
        else:
            ranges.append((n, n))
    return ranges


def executed_ranges(
    lines: Mapping[str, Mapping[str, Iterable[int]]],
) -> dict[str, dict[str, list[tuple[int, int]]]]:
    """The lines each failing test executed (test id -> path -> line numbers), as ranges of
    consecutive lines, the code's only (no test file, Python only), bounded: at most
    MAX_EXECUTED_FILES files a test and MAX_EXECUTED_RANGES ranges in all, the tests in their
    order, a test's whole spectrum or none of it."""
    kept: dict[str, dict[str, list[tuple[int, int]]]] = {}
    left = MAX_EXECUTED_RANGES
    for test_id, per_path in lines.items():
        found = {
            path: _ranges(numbers)
            for path, numbers in sorted(per_path.items())
            if path.endswith(".py") and not is_test_path(path) and indexed(path)
        }
        found = {p: r for p, r in found.items() if r}
        size = sum(len(r) for r in found.values())
        if not found or len(found) > MAX_EXECUTED_FILES or size > left:
            continue
        kept[test_id] = found
        left -= size
    return kept


@dataclass(frozen=True)
class Seeds:
    """What the task and its failing tests point at: files and names, and the lines the failing
    tests the task names executed on the base commit (`named`; when it names none of those
    traced, what every traced failing test executed; none known: empty)."""

    files: frozenset[str]
    names: frozenset[str]
    words: frozenset[str]
    executed: Mapping[str, Ranges] = field(default_factory=dict)
    named: bool = False

    def ran(self, symbol: Symbol) -> bool:
        """Whether the failing tests executed a line of `symbol`."""
        return any(a <= symbol.last and b >= symbol.first for a, b in self.executed.get(symbol.path, ()))


def seeds(description: str, failing: Iterable[str], failure: str, executed: Executed | None = None) -> Seeds:
    """The files and functions the failing tests' tracebacks pass through, the names their ids
    carry (`test_underscore` -> underscore, `ChunkedEvenTests` -> chunked_even), the words of
    the task, and the lines the failing tests the task names (`FailToPass`) executed."""
    files, names = set(), set()
    for match in _FRAME.finditer(failure):
        path, name = match.group(1) or match.group(3), match.group(2) or match.group(4)
        files.add(path)
        names.add(name)
    for test_id in failing:
        parts = test_id.split("[")[0].split("::")
        files.add(parts[0])
        for part in parts[1:]:
            bare = _snake(part).removeprefix("test_").removesuffix("_tests").removesuffix("_test")
            names.update({bare, *bare.split("_")} if not part.startswith("test_") else {bare})
    words = {w.lower() for w in _WORD.findall(description) if len(w) > 1 or w.islower()}
    traced = dict(executed or {})
    named = FailToPass(description).among(traced)
    ran: dict[str, list[tuple[int, int]]] = {}
    for test_id in named or traced:
        for path, ranges in traced[test_id].items():
            ran.setdefault(path, []).extend(ranges)
    return Seeds(frozenset(files), frozenset(n for n in names if n), frozenset(words), ran, bool(named))


EXECUTED_BONUS = 3.0  # above a traceback's file (1), below a name the tests carry (8)


def not_run(ranked: Iterable[Symbol], found: Seeds) -> set[Symbol]:
    """The symbols not where the bug is, by what the failing tests executed: when the task names
    failing tests that were traced, every symbol they did not run (if they ran any of `ranked`);
    else each symbol they did not run although they ran one of its name (the other branch of an
    `if PY3:`/`else:` pair)."""
    ranked = list(ranked)
    ran = {s for s in ranked if found.ran(s)}
    if found.named and ran:
        return set(ranked) - ran
    ran_names = {s.name for s in ran}
    return {s for s in ranked if s.name in ran_names and s not in ran}


def score(symbol: Symbol, found: Seeds) -> float:
    """How much the task points at `symbol` (0: not at all)."""
    name = symbol.name.lower()
    value = 0.0
    if name in found.words:
        value += 10 + min(len(name), 12) / 4  # a longer name named by the task says more
    if name in found.names:
        value += 8
    elif any(len(n) > 3 and (n in name or name in n) for n in found.names if n):
        value += 2
    if symbol.path in found.files or any(f.endswith("/" + symbol.path) for f in found.files):
        value += 1
    if found.ran(symbol):
        value += EXECUTED_BONUS
    if is_test_path(symbol.path):
        value = value / 4  # the code under test, before the tests that show the bug
    return value


def ranked_symbols(texts: Mapping[str, str], found: Seeds) -> list[tuple[float, Symbol]]:
    """Every symbol of the Python files with its score, the most relevant first."""
    scored = [
        (score(s, found), s) for path, text in texts.items() if indexed(path) for s in symbols(path, text)
    ]
    return sorted(scored, key=lambda pair: (-pair[0], pair[1].path, pair[1].first))


def numbered(text: str, first: int, last: int) -> str:
    """Lines `first`..`last` of `text`, each with its number (as `read_file` shows them)."""
    lines = text.splitlines()
    return "\n".join(f"{n}: {lines[n - 1]}" for n in range(first, min(last, len(lines)) + 1))


MAX_SHOWN_SYMBOL_LINES = 60  # a relevant function longer than this is named, not shown


MAX_MAP_LINE_CHARS = 400


def _file_line(path: str, scored: list[tuple[float, Symbol]]) -> str:
    """A file and its symbols with their lines: the ones the task points at first, then the
    others in order, within MAX_MAP_LINE_CHARS; how many were left out."""
    picked = [s for v, s in scored if v > 0] + sorted((s for v, s in scored if v <= 0), key=lambda s: s.first)
    line, shown = f"{path}:", 0
    for symbol in picked:
        entry = f" {symbol.name} {symbol.first}-{symbol.last};"
        if len(line) + len(entry) > MAX_MAP_LINE_CHARS:
            break
        line += entry
        shown += 1
    more = len(picked) - shown
    return line.rstrip(";") + (f" (+{more} more)" if more else "")


def repo_map(
    texts: Mapping[str, str],
    paths: Iterable[str],
    description: str,
    failing: Iterable[str],
    failure: str,
    max_tokens: int,
    count: Count = approx_tokens,
    executed: Executed | None = None,
) -> str:
    """The map within `max_tokens`: the most relevant functions' source (numbered lines; none
    that the failing tests' spectrum rules out, `not_run`), then the files with
    their symbols and line ranges, most relevant files first, then the other files' names; what
    does not fit is counted in a last line."""
    found = seeds(description, failing, failure, executed)
    ranked = ranked_symbols(texts, found)
    skipped = not_run([s for v, s in ranked if v >= 8], found)
    parts: list[str] = []
    used = 0

    def add(block: str) -> bool:
        nonlocal used
        size = count(block)
        if used + size > max_tokens:
            return False
        parts.append(block)
        used += size
        return True

    shown = 0
    for value, symbol in [(v, s) for v, s in ranked if s not in skipped][:3]:
        if value < 8 or symbol.last - symbol.first >= MAX_SHOWN_SYMBOL_LINES:
            continue
        body = numbered(texts[symbol.path], symbol.first, symbol.last)
        if add(
            f"--- {symbol.path}, {symbol.kind} {symbol.name} (lines {symbol.first}-{symbol.last}) ---\n{body}"
        ):
            shown += 1
    by_file: dict[str, float] = {}
    for value, symbol in ranked:
        by_file[symbol.path] = max(by_file.get(symbol.path, 0.0), value)
    order = sorted(
        (p for p in paths if indexed(p)),
        key=lambda p: (-by_file.get(p, -1.0), is_test_path(p), not p.endswith(".py"), p),
    )
    left = 0
    header_added = add(
        "Repository map (files, their functions and classes with line ranges; most relevant first):"
    )
    for path in order:
        line = _file_line(path, [(v, s) for v, s in ranked if s.path == path]) if path in by_file else path
        if not (header_added and add(line)):
            left += 1
    if left:
        parts.append(f"({left} more files not listed; list_files shows them)")
    return "\n".join(parts)


MAX_FOCUS_SYMBOLS = 3


def searches(text: str, first: int, last: int) -> list[str]:
    """What an edit may search for in lines `first`..`last` of `text`, each found once in the
    file (`edits.found_once`): each line, or where the line alone is not (a function defined in
    both branches of an `if`, a body line another function repeats) the line with the fewest
    lines after it, within the range, that are."""
    lines = text.splitlines()
    found = []
    for start in range(first - 1, min(last, len(lines))):
        if not lines[start].strip():
            continue
        for end in range(start, min(last, len(lines))):
            window = "\n".join(lines[start : end + 1])
            if found_once(text, window):
                found.append(window)
                break
    return found


def focus(
    texts: Mapping[str, str],
    description: str,
    failing: Iterable[str],
    failure: str,
    executed: Executed | None = None,
) -> dict[str, list[str]]:
    """Where the task and the failing tests point, as what an answer's edits may search for
    (path -> those texts, `searches`) in the code functions named by them (at most
    MAX_FOCUS_SYMBOLS, each of at most MAX_SHOWN_SYMBOL_LINES lines), as Agentless narrows its
    edits to the functions it localised, those the failing tests ran (`executed`) first and none
    they did not run (`not_run`); empty when they name none."""
    found = seeds(description, failing, failure, executed)
    picked: dict[str, list[str]] = {}
    candidates = [
        s
        for v, s in ranked_symbols(texts, found)
        if v >= 8 and not is_test_path(s.path) and s.last - s.first < MAX_SHOWN_SYMBOL_LINES
    ]
    skipped = not_run(candidates, found)
    chosen = [s for s in candidates if s not in skipped]
    for symbol in chosen[:MAX_FOCUS_SYMBOLS]:
        picked.setdefault(symbol.path, []).extend(searches(texts[symbol.path], symbol.first, symbol.last))
    return {path: list(dict.fromkeys(found)) for path, found in picked.items() if found}
