"""Agent turns with tools: a `TurnRunner` that runs each turn as engine calls and tool calls in
turn, until a reply holds no call or the step budget is spent (`domain.tools`), and that turns a
proposal's edits into its patch (`domain.edits`). A call the turn made before (same tool, same
arguments) is not run again: its output is already in the history, and the turn must answer next
(a small model otherwise repeats one search until its budget is spent).

Every engine call goes through the runner it wraps (the admission queue, the deadline), in
batches: all turns waiting for the engine go together. Tool calls run through `execute` (the
sandbox, against the read-only workspace). A reply with no call is the answer: its edits
(search/replace blocks, or the `json` protocol's edit list) are checked against `files` (the
checkout's texts). An edit that does not match is answered, like a tool call, with which edit and
why, while the budget lasts and the answer changes (the same refused answer twice stands); the
answer that stands carries the unified diff the system built in a ```diff block (a unified diff
the model wrote itself stays as it is). The finished turn's result carries that answer, every tool
step, and the tokens and engine time of all its calls. Schema-constrained answers (`json`) edit
the code files, not the tests the patch is judged by (tests only when there is nothing else).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence

from .deliberation import TurnRunner
from .edits import answer_schema, apply_edits, edits_from_json, parse_edit_blocks
from .models import Message, TurnKind, TurnRequest, TurnResult
from .tools import (
    TOOL_CALL_CLOSE,
    TOOLS,
    ParsedCall,
    StepBudget,
    ToolProtocol,
    ToolStep,
    json_call_schema,
    parse_json_reply,
    parse_tool_calls,
    results_message,
    tools_instruction,
)
from .workspace import extract_patch, is_test_path, rationale_of

TOOL_KINDS = frozenset({TurnKind.PROPOSE, TurnKind.REVISE})  # turns that write a patch
EDIT_STEP = "edit"  # the tool step of an answer whose edits did not all match
REPEATED = "error: this call was made before in this turn and its output is above: not run again"
Execute = Callable[[str, dict], str]
"""Runs one tool (name, arguments) and returns its output."""
OnStep = Callable[[TurnRequest, ToolStep], None]


def editable(files: Mapping[str, str]) -> dict[str, str]:
    """The files a schema-constrained answer edits: the code, not the tests it is judged by
    (all files when there is nothing else)."""
    code = {p: t for p, t in files.items() if not is_test_path(p)}
    return code or dict(files)


def turn_schema(files: Mapping[str, str], read: frozenset[str] = frozenset()) -> dict:
    """The JSON schema of a reply of a `json` turn: a tool call (reading a file not `read` yet),
    or the answer's edits (of the code files)."""
    return {"anyOf": [*json_call_schema(files, read), answer_schema(editable(files))]}


def with_tools(
    request: TurnRequest, protocol: ToolProtocol, files: Mapping[str, str], offer: bool = True
) -> TurnRequest:
    """The request with the protocol: its instruction in the last user message; for `text` the
    stop sequence that ends a call, for `openai` the tools, for `json` the reply's schema."""
    messages = list(request.messages)
    last = messages[-1]
    messages[-1] = Message(role=last.role, content=f"{last.content}\n\n{tools_instruction(protocol)}")
    update: dict = {"messages": messages}
    if protocol == "json":
        update["response_schema"] = turn_schema(files) if offer else answer_schema(editable(files))
    elif offer and protocol == "openai":
        update["tools"] = [t.openai() for t in TOOLS]
    elif offer:
        update["stop"] = [*request.stop, TOOL_CALL_CLOSE]
    return request.model_copy(update=update)


def without_calls(request: TurnRequest, protocol: ToolProtocol, files: Mapping[str, str]) -> TurnRequest:
    """The request once the calls are spent: the model must answer."""
    update: dict = {"stop": [s for s in request.stop if s != TOOL_CALL_CLOSE], "tools": None}
    if protocol == "json":
        update["response_schema"] = answer_schema(editable(files))
    return request.model_copy(update=update)


class _Turn:
    def __init__(self, request: TurnRequest, tooled: bool):
        self.request = request
        self.tooled = tooled
        self.steps: list[ToolStep] = []
        self.tokens_in = self.tokens_out = 0
        self.latency_ms = self.queue_ms = self.tool_ms = 0.0
        self.calls = 0
        self.started = time.monotonic()
        self.last_refusal = ""  # why the last answer's edits were refused
        self.stalled = False  # it repeated a call it had made: no more calls, it answers next

    def calls_left(self, budget: StepBudget) -> int:
        return 0 if self.stalled else budget.max_tool_calls - len(self.steps)

    def made(self, call: ParsedCall) -> bool:
        """Whether the turn already made this call (same tool, same arguments)."""
        return any(s.parsed and s.name == call.name and s.arguments == call.arguments for s in self.steps)

    def absorb(self, result: TurnResult) -> None:
        self.calls += 1
        self.tokens_in += result.tokens_in
        self.tokens_out += result.tokens_out
        self.latency_ms += result.latency_ms
        self.queue_ms += result.queue_ms

    def finish(self, result: TurnResult, content: str | None = None) -> TurnResult:
        return result.model_copy(
            update={
                "tool_steps": self.steps,
                "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out,
                "latency_ms": self.latency_ms,
                "queue_ms": self.queue_ms,
                "tool_ms": self.tool_ms,
                "engine_calls": self.calls,
                **({"content": content} if content is not None else {}),
            }
        )


def answer_patch(protocol: ToolProtocol, reply: str, answer: dict | None, files: Mapping[str, str]):
    """(the answer as it stands, with the built diff; why its edits did not all match, or "").
    No edits: the reply as it is (a unified diff in it stays the patch)."""
    if answer is not None:
        edits, why = edits_from_json(answer)
        rationale = str(answer.get("rationale", "")).strip()
        if why:
            return rationale, f"error: {why}"
    else:
        edits, rationale = parse_edit_blocks(reply), ""
        if not edits:
            if extract_patch(reply) or not files:
                return reply, ""
            return reply, "error: the answer holds no edit: give each change as a search/replace block"
        rationale = rationale_of(reply.split("<<<<<<<")[0].rsplit("\n", 2)[0]).strip()
    outcome = apply_edits(files, edits)
    text = f"{rationale}\n\n```diff\n{outcome.patch}```\n" if outcome.patch else rationale
    if outcome.failures:
        applied = f" The other edits matched ({', '.join(outcome.changed)})." if outcome.changed else ""
        return text, "error: " + "; ".join(outcome.failures) + "." + applied + (
            " Give all your edits again, each search text copied exactly from the file."
        )
    if not outcome.patch:
        return text, "error: the edits change nothing"
    return text, ""


def tool_turns(
    run_step: TurnRunner,
    execute: Execute,
    budget: StepBudget,
    kinds: frozenset[TurnKind] = TOOL_KINDS,
    protocol: ToolProtocol = "text",
    files: Mapping[str, str] | None = None,
    offer: bool = True,
    on_step: OnStep | None = None,
    on_result: Callable[[TurnResult], None] | None = None,
) -> TurnRunner:
    """A TurnRunner whose turns of `kinds` may call tools in `protocol` (`offer` False: none, the
    edits are still checked) and whose answers' edits on `files` (path -> text) become a patch;
    `run_step` runs single engine calls (without reporting ends: `on_result` sees each whole turn
    once, at its end)."""
    texts = dict(files or {})

    def run_calls(turn: _Turn, calls: list[ParsedCall]) -> list[ToolStep]:
        ran = []
        for call in calls[: turn.calls_left(budget)]:
            start = time.monotonic()
            if call.error:
                step = ToolStep(
                    name=call.name or "?", text=call.text, parsed=False, output=f"error: {call.error}"
                )
            elif turn.made(call):  # its output is above: a model that repeats itself answers now
                turn.stalled = True
                step = ToolStep(name=call.name, arguments=call.arguments, output=REPEATED)
            else:
                output = execute(call.name, call.arguments)
                step = ToolStep(name=call.name, arguments=call.arguments, output=output)
            step.duration_ms = round((time.monotonic() - start) * 1000, 1)
            turn.tool_ms += step.duration_ms
            record(turn, step)
            ran.append(step)
        return ran

    def record(turn: _Turn, step: ToolStep) -> None:
        turn.steps.append(step)
        if on_step is not None:
            on_step(turn.request, step)

    def run(requests: Sequence[TurnRequest]) -> list[TurnResult]:
        turns = []
        for r in requests:
            tooled = r.kind in kinds
            turns.append(_Turn(with_tools(r, protocol, texts, offer) if tooled else r, tooled))
        final: dict[int, TurnResult] = {}
        waiting = {i: t.request for i, t in enumerate(turns)}
        while waiting:
            order = list(waiting)
            results = run_step([waiting[i] for i in order])
            waiting = {}
            for i, result in zip(order, results, strict=True):
                turn = turns[i]
                turn.absorb(result)
                left = budget.max_tool_calls - len(turn.steps)  # steps: tool calls and refused answers
                out_of_time = time.monotonic() - turn.started >= budget.max_seconds
                tokens_left = budget.max_tokens - turn.tokens_out
                can_go_on = left > 0 and not out_of_time and tokens_left > 0
                if not (turn.tooled and result.ok):
                    final[i] = finish(turn, result)
                    continue
                calls, answer, broken = [], None, ""
                if protocol == "json":
                    call, answer, broken = parse_json_reply(result.content)
                    calls = [call] if call is not None else []
                elif offer:
                    calls = parse_tool_calls(result.content)
                if calls and can_go_on and turn.calls_left(budget) > 0:
                    ran = run_calls(turn, calls)
                    reply = Message(role="user", content=results_message(ran, turn.calls_left(budget)))
                    waiting[i] = turn.request = next_request(turn, result.content, ran, [reply], tokens_left)
                    continue
                if broken:
                    content, why = result.content, f"error: {broken}"
                else:
                    content, why = answer_patch(protocol, result.content, answer, texts)
                repeated = why and why == turn.last_refusal  # the same answer again: no progress
                turn.last_refusal = why
                if not why or not can_go_on or repeated:
                    final[i] = finish(turn, result, content)
                    continue
                step = ToolStep(name=EDIT_STEP, arguments={"answer": result.content[:200]}, output=why)
                record(turn, step)
                reply = Message(role="user", content=results_message([step], turn.calls_left(budget)))
                waiting[i] = turn.request = next_request(turn, result.content, [], [reply], tokens_left)
        return [final[i] for i in range(len(turns))]

    def finish(turn: _Turn, result: TurnResult, content: str | None = None) -> TurnResult:
        done = turn.finish(result, content)
        if on_result is not None:
            on_result(done)
        return done

    def next_request(
        turn: _Turn, reply: str, ran: list[ToolStep], answers: list[Message], tokens_left: int
    ) -> TurnRequest:
        """The turn's next engine call: its history, the reply that made the calls, their results
        (native calls: each a `tool` message); no more calls offered once the budget is spent."""
        if protocol == "openai" and ran:
            calls = parse_tool_calls(reply)
            said = reply.split("<tool_call>")[0].strip()
            native = [
                {
                    "id": c.call_id or f"call_{n}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for n, c in enumerate(calls[: len(ran)])
            ]
            messages = [
                *turn.request.messages,
                Message(role="assistant", content=said, tool_calls=native),
                *(
                    Message(role="tool", tool_call_id=n["id"], content=step.output[:4_000])
                    for n, step in zip(native, ran, strict=False)
                ),
            ]
        else:
            messages = [*waiting_messages(turn, reply), *answers]
        request = turn.request.model_copy(
            update={"messages": messages, "max_tokens": min(turn.request.max_tokens, tokens_left)}
        )
        if turn.calls_left(budget) <= 0:
            request = without_calls(request, protocol, texts)
        elif protocol == "json":
            read = frozenset(str(s.arguments.get("path")) for s in turn.steps if s.name == "read_file")
            request = request.model_copy(update={"response_schema": turn_schema(texts, read)})
        return request

    return run


def waiting_messages(turn: _Turn, reply: str) -> list[Message]:
    """The turn's history so far with the reply that made the calls (a text call closed, as the
    stop sequence cut it)."""
    closed = reply
    if TOOL_CALL_CLOSE in turn.request.stop and not reply.rstrip().endswith(TOOL_CALL_CLOSE):
        closed = reply.rstrip() + TOOL_CALL_CLOSE if "<tool_call>" in reply else reply
    return [*turn.request.messages, Message(role="assistant", content=closed)]
