"""Tools an agent may call during a turn on a repository task, and the three protocols the
engine is asked in (`ToolProtocol`, chosen per engine).

- `text`: any model. A call is one line `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  (the form Hermes- and Qwen-style chat templates use).
- `openai`: native tool calling. The tools go as OpenAI `tools`; the engine client assembles the
  streamed `tool_calls` deltas and writes each call in the text form with its id, so one parser
  reads both; each call is answered as a `tool` message.
- `json`: every reply is one JSON object decoded under the engine's JSON schema (llama.cpp's
  grammar, vLLM's guided decoding): a tool call `{"tool", "arguments"}` whose arguments name the
  repository's real files, or the answer `{"edits", "rationale"}` (`domain.edits`). A call is
  well formed or absent, never half-written: the protocol for small models.

A call that cannot be parsed is kept as text, answered with the parse error, and counts against
the budget like any call. The turn ends when a reply holds no call, or when its step budget (tool
calls, completion tokens, seconds) is spent; then the last reply stands.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .repomap import find_symbol, numbered, symbols

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
MAX_TOOL_OUTPUT_CHARS = 3_000  # a tool's output beyond this is cut: its head and tail, and a note
READ_WINDOW_LINES = 60  # lines a read shows when it names no end
MAX_SYMBOL_LINES = 150  # lines a read by symbol shows at most
MAX_SEARCH_HITS = 20
MAX_LISTED_FILES = 100
MIN_REPLY_TOKENS = 32  # a request that leaves less of the engine's window for its reply is not sent
ToolProtocol = Literal["text", "openai", "json"]
JSON_TOOLS = ("read_file", "search_text")  # what a `json` turn may call (the answer carries the edits)


class ToolSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict

    def openai(self) -> dict:
        """The OpenAI `tools` entry."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def _object(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required)}


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="list_files",
        description="List the repository's files under a folder.",
        parameters=_object(
            {"path": {"type": "string", "description": "Folder, relative; default the root."}}
        ),
    ),
    ToolSpec(
        name="read_file",
        description="Read lines of a file of the repository (numbered; 60 from start_line unless "
        "end_line says), or one function or class of it by name (symbol).",
        parameters=_object(
            {
                "path": {"type": "string"},
                "symbol": {"type": "string", "description": "A function or class name, optional."},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
            },
            ("path",),
        ),
    ),
    ToolSpec(
        name="search_text",
        description="Search the repository's files for a text; returns path:line: matches.",
        parameters=_object({"text": {"type": "string"}}, ("text",)),
    ),
    ToolSpec(
        name="run_tests",
        description="Run the repository's test command, with `patch` (a unified diff) applied when given.",
        parameters=_object({"patch": {"type": "string", "description": "A unified diff, optional."}}),
    ),
)
TOOL_NAMES = frozenset(t.name for t in TOOLS)


class StepBudget(BaseModel):
    """What one turn may spend on tools, inside the deliberation's deadline."""

    model_config = ConfigDict(frozen=True)

    max_tool_calls: int = Field(
        default=6, ge=0, le=50, description="Tool calls per turn (unparseable ones count)."
    )
    max_tokens: int = Field(
        default=3_000, ge=1, description="Completion tokens per turn, over all its engine calls."
    )
    max_seconds: float = Field(
        default=240.0, gt=0, description="Wall time per turn, engine and tools together."
    )


class ToolStep(BaseModel):
    """One tool call of a turn and its result: part of the turn's history."""

    name: str
    arguments: dict = Field(default_factory=dict)
    text: str = ""  # the call as the model wrote it, when it could not be parsed
    parsed: bool = True
    output: str = ""
    duration_ms: float = 0.0


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict
    text: str
    error: str = ""
    call_id: str = ""  # a native call's id (its `tool` answer names it)


def parse_tool_calls(reply: str) -> list[ParsedCall]:
    """The calls in a reply, each parsed or with its error (kept as text)."""
    calls = []
    for match in _CALL.finditer(reply):
        raw = match.group(1).strip()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            calls.append(ParsedCall("", {}, raw, f"not JSON: {exc.msg}"))
            continue
        if not isinstance(data, dict):
            calls.append(ParsedCall("", {}, raw, "a call is a JSON object"))
            continue
        name = data.get("name", data.get("tool"))
        call_id = str(data.get("id") or "")
        arguments = data.get("arguments", data.get("parameters", {}))
        if isinstance(arguments, str):  # OpenAI sends arguments as a JSON string
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                arguments = None
        if name not in TOOL_NAMES:
            calls.append(
                ParsedCall(str(name or ""), {}, raw, f"unknown tool {name!r}; tools: {sorted(TOOL_NAMES)}")
            )
        elif not isinstance(arguments, dict):
            calls.append(ParsedCall(str(name), {}, raw, "arguments must be a JSON object"))
        else:
            calls.append(ParsedCall(str(name), arguments, raw, call_id=call_id))
    return calls


def render_call(name: str, arguments: str | dict, call_id: str = "") -> str:
    """A structured call (OpenAI `tool_calls`) in the text protocol's form, with its id."""
    head = {"id": call_id} if call_id else {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            fields = "".join(f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in {**head, "name": name}.items())
            return f'{TOOL_CALL_OPEN}{{{fields}"arguments": {arguments}}}{TOOL_CALL_CLOSE}'
    return f"{TOOL_CALL_OPEN}{json.dumps({**head, 'name': name, 'arguments': arguments})}{TOOL_CALL_CLOSE}"


def json_call_schema(files: Mapping[str, str], read: frozenset[str] = frozenset()) -> list[dict]:
    """The JSON schemas of a `json` turn's tool calls: `read_file` of one of `files` not `read`
    whole yet (a small model reads one file again and again), by symbol or from a line, and
    `search_text`."""
    paths = [p for p in files if p not in read]
    reads = [
        {
            "type": "object",
            "properties": {
                "tool": {"const": "read_file"},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "path": {"enum": paths},
                        "symbol": {"type": "string", "minLength": 1, "maxLength": 80},
                        "start_line": {"type": "integer", "minimum": 1},
                    },
                    "required": ["path"],
                    "additionalProperties": False,
                },
            },
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        }
    ]
    return [
        *(reads if paths else []),
        {
            "type": "object",
            "properties": {
                "tool": {"const": "search_text"},
                "arguments": {
                    "type": "object",
                    "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 80}},
                    "required": ["text"],
                    "additionalProperties": False,
                },
            },
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        },
    ]


def parse_json_reply(reply: str) -> tuple[ParsedCall | None, dict | None, str]:
    """A `json` turn's reply: (the tool call, None, "") or (None, the answer, "") or (None, None,
    why it is neither: cut off by the token limit, not JSON)."""
    try:
        data = json.loads(reply)
    except json.JSONDecodeError as exc:
        kept = complete_edits(reply)
        if kept:
            return None, {"edits": kept, "rationale": ""}, ""
        return None, None, f"the reply is not one JSON object ({exc.msg}); it may have been cut off"
    if not isinstance(data, dict):
        return None, None, "the reply must be one JSON object"
    if "tool" in data:
        [call] = parse_tool_calls(f"{TOOL_CALL_OPEN}{reply}{TOOL_CALL_CLOSE}")
        return call, None, ""
    return None, data, ""


_EDITS_OPEN = re.compile(r'^\s*\{\s*"edits"\s*:\s*\[')


def complete_edits(reply: str) -> list[dict]:
    """The edit objects an answer cut off by its token limit wrote whole, in order (the schema
    puts the edits first, so a cut reply still holds them): none when it is not such an answer."""
    opened = _EDITS_OPEN.match(reply)
    if not opened:
        return []
    decoder, at, kept = json.JSONDecoder(), opened.end(), []
    while True:
        at = len(reply) - len(reply[at:].lstrip(" \t\r\n,"))
        try:
            item, at = decoder.raw_decode(reply, at)
        except json.JSONDecodeError:
            return kept
        if not isinstance(item, dict):
            return kept
        kept.append(item)


EDIT_EXAMPLE = "app.py\n<<<<<<< SEARCH\n    return x\n=======\n    return x + 1\n>>>>>>> REPLACE"


def tools_instruction(protocol: ToolProtocol = "text") -> str:
    """How the turn calls tools and gives its edits, as the prompt states it."""
    if protocol == "json":
        return (
            "Reply with ONE JSON object. To read a file first: "
            '{"tool": "read_file", "arguments": {"path": "calc.py"}}. '
            "To answer, give your edits: each names a file, one of its lines exactly as written "
            "(search) and the line(s) replacing it: "
            '{"edits": [{"path": "app.py", "search": "    return x", "replace": "    return x + 1"}], '
            '"rationale": "the test expects x + 1"}.'
        )
    answer = (
        "When you are done, answer with no tool call: give each change as a search/replace block, "
        "the file's path on its own line, then the exact lines to find and what replaces them:\n"
        f"{EDIT_EXAMPLE}\n"
        "(A unified diff in a ```diff block is accepted too.)"
    )
    if protocol == "openai":  # the engine's chat template lists the tools: the prompt says no more
        return answer
    lines = [f"- {t.name}({', '.join(t.parameters['properties'])}): {t.description}" for t in TOOLS]
    return (
        "You may call tools before you answer. To call one, write exactly one line\n"
        f'{TOOL_CALL_OPEN}{{"name": "read_file", "arguments": {{"path": "calc.py"}}}}{TOOL_CALL_CLOSE}\n'
        "and stop: the result comes in the next message. Tools:\n" + "\n".join(lines) + "\n" + answer
    )


def _one_line(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def step_line(step: ToolStep, limit: int = 80) -> str:
    """A tool call as a person follows it, on one line: the tool, its arguments cut to a line,
    its outcome (the output's first line, or why it did not run) and its time."""
    call = json.dumps(step.arguments) if step.parsed else f"unparsed {step.text!r}"
    first = next((line for line in step.output.splitlines() if line.strip()), "(no output)")
    return (
        f"{step.name} {_one_line(call, limit)} -> {_one_line(first, limit)} ({step.duration_ms / 1000:.1f} s)"
    )


def results_message(steps: list[ToolStep], budget_left: int) -> str:
    """The next user message: each call's result (or why it could not run)."""
    parts = []
    for step in steps:
        head = (
            f"{step.name}({json.dumps(step.arguments)})"
            if step.parsed
            else f"unparsed call {step.text[:200]!r}"
        )
        parts.append(f"Result of {head}:\n{page(step.output)}")
    tail = (
        f"You may make {budget_left} more tool call(s)."
        if budget_left > 0
        else "The tool budget is spent: give your final answer now, without tool calls."
    )
    return "\n\n".join(parts) + "\n\n" + tail


def page(text: str, limit: int = MAX_TOOL_OUTPUT_CHARS) -> str:
    """`text` within `limit` characters: whole, else its first two thirds and last third of
    lines with a note of how many lines were left out between them."""
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    head, tail, size = [], [], 0
    for line in lines:
        if size + len(line) + 1 > (2 * limit) // 3:
            break
        head.append(line)
        size += len(line) + 1
    for line in reversed(lines[len(head) :]):
        if size + len(line) + 1 > limit - 80:
            break
        tail.insert(0, line)
        size += len(line) + 1
    left = len(lines) - len(head) - len(tail)
    if not head and not tail:  # one long line
        return text[: limit - 80] + f"\n[... {len(text) - limit + 80} characters left out]"
    note = f"[... {left} lines left out: ask for a narrower range or a longer search text ...]"
    return "\n".join([*head, note, *tail])


def read_text(texts: Mapping[str, str], arguments: Mapping) -> str:
    """`read_file` on the checkout's texts: a function or class by `symbol`, else lines from
    `start_line` (1) to `end_line` (READ_WINDOW_LINES on), numbered, with where the file goes on."""
    path = str(arguments.get("path", "")).strip().removeprefix("./")
    if path not in texts:
        return f"error: no text file {path!r} in the repository (list_files shows them)"
    text = texts[path]
    total = len(text.splitlines())
    name = str(arguments.get("symbol") or "").strip()
    if name:
        symbol = find_symbol(path, text, name)
        if symbol is None:
            names = sorted({s.name for s in symbols(path, text)})
            close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
            hint = f" (close: {', '.join(close)})" if close else ""
            return f"error: no function or class {name!r} in {path}{hint}; search_text finds where a name is"
        last = min(symbol.last, symbol.first + MAX_SYMBOL_LINES - 1)
        more = f"\n({symbol.name} goes on to line {symbol.last})" if last < symbol.last else ""
        return numbered(text, symbol.first, last) + more
    try:
        start = max(1, int(arguments.get("start_line") or 1))
        end = int(arguments.get("end_line") or start + READ_WINDOW_LINES - 1)
    except (TypeError, ValueError):
        return "error: start_line and end_line are line numbers"
    end = min(total, max(start, end), start + 2 * READ_WINDOW_LINES - 1)
    if start > total:
        return f"error: {path} has {total} lines"
    more = f"\n(lines {start}-{end} of {total}; read on with start_line, or a function by symbol)"
    return numbered(text, start, end) + (more if end < total or start > 1 else "")


def search_texts(texts: Mapping[str, str], arguments: Mapping) -> str:
    """`search_text` on the checkout's texts: `path:line: text` of the first MAX_SEARCH_HITS
    matching lines (code before tests), with how many more there are."""
    needle = str(arguments.get("text", ""))
    if not needle.strip():
        return "error: search for a non-empty text"
    hits = []
    for path, text in texts.items():
        for number, line in enumerate(text.splitlines(), 1):
            if needle in line:
                hits.append(f"{path}:{number}: {line.strip()[:160]}")
    if not hits:
        return f"no match for {needle!r}"
    more = len(hits) - MAX_SEARCH_HITS
    return "\n".join(hits[:MAX_SEARCH_HITS]) + (
        f"\n({more} more matches not shown: search a longer text)" if more > 0 else ""
    )


def list_paths(paths: Sequence[str], arguments: Mapping) -> str:
    """`list_files` on the index: the files under a folder, at most MAX_LISTED_FILES."""
    folder = str(arguments.get("path") or "").strip().strip("/").removeprefix("./")
    folder = "" if folder == "." else folder
    under = [p for p in paths if not folder or p.startswith(folder + "/")]
    if not under:
        return f"error: no files under {folder!r}"
    more = len(under) - MAX_LISTED_FILES
    return "\n".join(under[:MAX_LISTED_FILES]) + (f"\n({more} more files)" if more > 0 else "")
