"""Tools an agent may call during a turn on a repository task, and the plain-text protocol any
model can follow.

A call is one line `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the form Hermes-
and Qwen-style chat templates use); an engine with OpenAI tool calling returns structured calls,
which the engine client writes in the same form, so one parser serves both protocols. A call that
cannot be parsed is kept as text, answered with the parse error, and counts against the budget
like any call. The turn ends when a reply holds no call, or when its step budget (tool calls,
completion tokens, seconds) is spent; then the last reply stands.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
MAX_TOOL_OUTPUT_CHARS = 4_000


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
        description="Read a file of the repository, or a range of its lines (numbered).",
        parameters=_object(
            {
                "path": {"type": "string"},
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
        name = data.get("name")
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
            calls.append(ParsedCall(str(name), arguments, raw))
    return calls


def render_call(name: str, arguments: str | dict) -> str:
    """A structured call (OpenAI `tool_calls`) in the text protocol's form."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return (
                f'{TOOL_CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{TOOL_CALL_CLOSE}'
            )
    return f"{TOOL_CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{TOOL_CALL_CLOSE}"


def tools_instruction() -> str:
    """The plain-text protocol, as the prompt states it."""
    lines = [f"- {t.name}({', '.join(t.parameters['properties'])}): {t.description}" for t in TOOLS]
    return (
        "You may call tools before you answer. To call one, write exactly one line\n"
        f'{TOOL_CALL_OPEN}{{"name": "read_file", "arguments": {{"path": "calc.py"}}}}{TOOL_CALL_CLOSE}\n'
        "and stop: the result comes in the next message. Tools:\n" + "\n".join(lines) + "\n"
        "When you are done, give your answer with no tool call."
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
        parts.append(f"Result of {head}:\n{step.output[:MAX_TOOL_OUTPUT_CHARS]}")
    tail = (
        f"You may make {budget_left} more tool call(s)."
        if budget_left > 0
        else "The tool budget is spent: give your final answer now, without tool calls."
    )
    return "\n\n".join(parts) + "\n\n" + tail
