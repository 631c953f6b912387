"""Edits a proposal gives instead of a unified diff, and the diff the system builds from them.

An edit names a file, a text of it to find (`search`) and what replaces it (`replace`), the form
Aider's and Agentless's edit formats use: a model writes the lines it means, never line numbers or
hunk headers. Edits come as search/replace blocks in a reply's text

    calc.py
    <<<<<<< SEARCH
        return a - b
    =======
        return a + b
    >>>>>>> REPLACE

or as JSON objects (`{"path", "search", "replace"}`: the reply of a schema-constrained turn, an
`edit_file` tool call). `apply_edits` checks each one against the files' texts (the read-only
checkout's, read by the workspace layer) and builds the unified diff with difflib; an edit that does
not match is reported by number with why, for the agent to fix. Pure: no I/O.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_EDITS = 4  # edits in one schema-constrained answer (a small model repeats itself to the token limit)
MAX_ENUM_LINES = 600  # a schema lists at most this many lines to search for (over all files)
MAX_SCHEMA_FILES = 40  # files a schema-constrained answer may edit (the first given: code first)
MAX_REPLACE_CHARS = 600
MAX_RATIONALE_CHARS = 300

_BLOCK = re.compile(
    r"(?:^|\n)(?:```[^\n]*\n)?(?P<path>[^\n<>=`]+?)[ \t]*\n(?:```[^\n]*\n)?"
    r"<{5,9} ?SEARCH[^\n]*\n(?P<search>.*?)(?:^|\n)={5,9}[ \t]*\n(?P<replace>.*?)(?:^|\n)>{5,9} ?REPLACE",
    re.DOTALL,
)


class Edit(BaseModel):
    """Replace `search` (an exact text of `path`; empty: `path` is a new file) with `replace`."""

    model_config = ConfigDict(frozen=True)

    path: str = Field(min_length=1)
    search: str = ""
    replace: str = ""


@dataclass(frozen=True)
class EditOutcome:
    """What the edits made: the unified diff ("" when none applied or none changed anything) and,
    per edit that did not apply, its number (1-based) and why."""

    patch: str
    failures: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.patch) and not self.failures


def parse_edit_blocks(text: str) -> list[Edit]:
    """The search/replace blocks of a reply, in order (a path line, then the block)."""
    edits = []
    for match in _BLOCK.finditer(text):
        path = match.group("path").strip().strip("`*").strip()
        edits.append(Edit(path=path, search=match.group("search"), replace=match.group("replace")))
    return edits


def edits_from_json(data: object) -> tuple[list[Edit], str]:
    """The edits of a JSON answer (`{"edits": [...]}` or one edit object); with why they are not
    edits when they are not ("" when they are)."""
    items = data.get("edits", [data]) if isinstance(data, dict) else data
    if not isinstance(items, list):
        return [], "`edits` must be a list of {path, search, replace} objects"
    edits: list[Edit] = []
    for number, item in enumerate(items, start=1):
        try:
            edit = Edit.model_validate(item)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return [], f"edit {number}: {where or 'edit'}: {first['msg']}"
        if edit not in edits:  # a small model repeats an edit: the repeat would no longer match
            edits.append(edit)
    return edits, ""


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _reindent(replace: str, found_first: str, search_first: str) -> str:
    """`replace` with its indentation moved as the file's matched text is from the search text's;
    a replacement written with no indentation at all for an indented search takes the found
    indentation (a small model drops leading spaces)."""
    have, want = _indent(search_first), _indent(found_first)
    lines = _lines(replace)
    if have == want and not (want and lines and all(not _indent(x) for x in lines if x.strip())):
        return replace
    out = []
    for line in lines:
        if not line.strip():
            out.append(line)
        elif have and line.startswith(have):
            out.append(want + line[len(have) :])
        else:
            out.append(want + line.lstrip(" \t"))
    return "".join(out)


def _find(text: str, search: str) -> tuple[int, int, str] | str:
    """Where `search` is in `text` as (start, end, the file's first matched line): exactly once,
    else as whole lines, each compared without its leading and trailing blanks. A string says
    why not."""
    count = text.count(search)
    if count == 1:
        start = text.index(search)
        return start, start + len(search), _lines(search)[0] if search else ""
    wanted = [line.strip() for line in search.splitlines()]
    while wanted and not wanted[-1]:
        wanted.pop()
    while wanted and not wanted[0]:
        wanted.pop(0)
    if not wanted:
        return "the search text is blank"
    lines = _lines(text)
    hits = [
        i
        for i in range(len(lines) - len(wanted) + 1)
        if [x.strip() for x in lines[i : i + len(wanted)]] == wanted
    ]
    if len(hits) > 1 or (count > 1 and not hits):
        times = len(hits) if len(hits) > 1 else count
        return f"the search text occurs {times} times; give more lines so it is unique"
    if not hits:
        close = difflib.get_close_matches(wanted[0], [x.strip() for x in lines], n=1, cutoff=0.6)
        hint = f"; the closest line is {close[0]!r}" if close else ""
        return f"the search text is not in the file{hint}"
    start = sum(len(x) for x in lines[: hits[0]])
    end = start + sum(len(x) for x in lines[hits[0] : hits[0] + len(wanted)])
    return start, end, lines[hits[0]]


def apply_edits(files: Mapping[str, str], edits: Sequence[Edit]) -> EditOutcome:
    """The edits applied in order to the texts of `files` (path -> text); the unified diff of
    every file they changed (git's form: a/ and b/ paths, three lines of context), and why each
    edit that did not apply did not (the others still apply)."""
    texts = dict(files)
    failures = []
    for number, edit in enumerate(edits, start=1):
        path = edit.path.strip().removeprefix("./")
        if not edit.search.strip():
            if path in texts and texts[path].strip():
                failures.append(f"edit {number} ({path}): the search text is empty but the file exists")
            else:
                texts[path] = edit.replace
            continue
        if path not in texts:
            known = difflib.get_close_matches(path, list(texts), n=1)
            hint = f"; did you mean {known[0]}?" if known else ""
            failures.append(f"edit {number} ({path}): no such file in the repository{hint}")
            continue
        found = _find(texts[path], edit.search)
        if isinstance(found, str):
            failures.append(f"edit {number} ({path}): {found}")
            continue
        start, end, first = found
        replace = _reindent(edit.replace, first, _lines(edit.search.lstrip("\n"))[0])
        matched = texts[path][start:end]
        if matched.endswith("\n") and replace and not replace.endswith("\n"):
            replace += "\n"
        if replace == matched:
            failures.append(f"edit {number} ({path}): the replacement is the same as the search text")
            continue
        texts[path] = texts[path][:start] + replace + texts[path][end:]
    patch, changed = unified_diff(files, texts)
    return EditOutcome(patch=patch, failures=failures, changed=changed)


def unified_diff(before: Mapping[str, str], after: Mapping[str, str]) -> tuple[str, list[str]]:
    """The unified diff from `before` to `after` (path -> text) as `git diff` writes it, and the
    paths it changes."""
    parts, changed = [], []
    for path in sorted(after):
        old, new = before.get(path), after[path]
        if old == new:
            continue
        changed.append(path)
        old_lines, new_lines = _lines(old or ""), _lines(new)
        for lines in (old_lines, new_lines):
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n\\ No newline at end of file\n"
        head = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if old is None else "")
        body = difflib.unified_diff(
            old_lines, new_lines, "/dev/null" if old is None else f"a/{path}", f"b/{path}", n=3
        )
        parts.append(head + "".join(body))
    return "".join(parts), changed


def found_once(text: str, search: str) -> bool:
    """Whether an edit searching `search` in `text` applies (`apply_edits`: found once)."""
    return not isinstance(_find(text, search), str)


def edit_schema(files: Mapping[str, str | Sequence[str]]) -> dict:
    """The JSON schema of one edit on `files` (the first MAX_SCHEMA_FILES; path -> its text, or
    the search texts an edit may take there, as `repomap.focus` gives them): per file, `path` that
    file and `search` one of its lines (whole, as in the file) or of those texts, so an edit
    decoded under it always matches; beyond MAX_ENUM_LINES options in all, a file's `search` is
    any text (checked when applied)."""
    options, listed = [], 0
    for path, text in list(files.items())[:MAX_SCHEMA_FILES]:
        given = text.splitlines() if isinstance(text, str) else text
        lines = list(dict.fromkeys(x.rstrip("\n") for x in given if x.strip()))
        search: dict = {"type": "string", "minLength": 1, "maxLength": MAX_REPLACE_CHARS}
        if lines and listed + len(lines) <= MAX_ENUM_LINES:
            search = {"enum": lines}
            listed += len(lines)
        options.append(
            {
                "type": "object",
                "properties": {
                    "path": {"const": path},
                    "search": search,
                    "replace": {"type": "string", "maxLength": MAX_REPLACE_CHARS},
                },
                "required": ["path", "search", "replace"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


def answer_schema(files: Mapping[str, str | Sequence[str]]) -> dict:
    """The JSON schema of a proposal's answer on `files`: its edits, then a short rationale."""
    return {
        "type": "object",
        "properties": {
            "edits": {"type": "array", "items": edit_schema(files), "minItems": 1, "maxItems": MAX_EDITS},
            "rationale": {"type": "string", "maxLength": MAX_RATIONALE_CHARS},
        },
        "required": ["edits", "rationale"],
        "additionalProperties": False,
    }
