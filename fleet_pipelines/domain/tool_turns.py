"""Agent turns with tools: `ToolTurns`, a `TurnRunner` that runs each turn as engine calls and tool calls in
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
the model wrote itself stays as it is). An answer refused once the calls are spent gets one more
call with the reason, outside the budget (the last call is not lost to a malformed answer). The
finished turn's result carries that answer, every tool step, and the tokens and engine time of
all its calls. Schema-constrained answers (`json`) edit
the code files, not the tests the patch is judged by (tests only when there is nothing else).

Every request fits the engine's window (`Meter`: the window and the engine's own count of a
request): before each call, until the request and its reply fit, the oldest tool results of
earlier exchanges are left out (a note says so), then earlier exchanges whole (a reply that made
calls with their results: the model's own replies grow the history too), then the latest
exchange's results; the reply is capped to what is left, and a request that still leaves no room
for a reply is not sent: the turn ends FAILED with `ContextExceeded` and the counts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .deliberation import TurnRunner
from .edits import answer_schema, apply_edits, edits_from_json, parse_edit_blocks
from .models import Message, TurnKind, TurnRequest, TurnResult, TurnStatus
from .tools import (
    MIN_REPLY_TOKENS,
    READ_WINDOW_LINES,
    TOOL_CALL_CLOSE,
    TOOLS,
    ParsedCall,
    StepBudget,
    ToolProtocol,
    ToolStep,
    json_call_schema,
    page,
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
CONTEXT_EXCEEDED = "ContextExceeded"
RESULT_PREFIX = "Result of "  # how `results_message` begins
ELIDED = "(this tool result was left out to fit the engine's context window; call again if needed)"


class Meter(Protocol):
    """An engine's context window and its own count of a request's prompt tokens."""

    window: int

    def count(self, request: TurnRequest) -> int | None:
        """The request's prompt tokens as the engine counts them; None when it cannot say."""
        ...


def editable(files: Mapping[str, str]) -> dict[str, str]:
    """The files a schema-constrained answer edits: the code, not the tests it is judged by
    (all files when there is nothing else)."""
    code = {p: t for p, t in files.items() if not is_test_path(p)}
    return code or dict(files)


def turn_schema(
    files: Mapping[str, str],
    read: frozenset[str] = frozenset(),
    answers: Mapping[str, Sequence[str]] | None = None,
) -> dict:
    """The JSON schema of a reply of a `json` turn: a tool call (reading a file not `read` yet),
    or the answer's edits (of `answers`, else the code files)."""
    return {"anyOf": [*json_call_schema(files, read), answer_schema(answers or editable(files))]}


def with_tools(
    request: TurnRequest,
    protocol: ToolProtocol,
    files: Mapping[str, str],
    offer: bool = True,
    answers: Mapping[str, Sequence[str]] | None = None,
) -> TurnRequest:
    """The request with the protocol: its instruction in the last user message; for `text` the
    stop sequence that ends a call, for `openai` the tools, for `json` the reply's schema."""
    messages = list(request.messages)
    last = messages[-1]
    messages[-1] = Message(role=last.role, content=f"{last.content}\n\n{tools_instruction(protocol)}")
    update: dict = {"messages": messages}
    if protocol == "json":
        schema = turn_schema(files, answers=answers) if offer else answer_schema(answers or editable(files))
        update["response_schema"] = schema
    elif offer and protocol == "openai":
        update["tools"] = [t.openai() for t in TOOLS]
    elif offer:
        update["stop"] = [*request.stop, TOOL_CALL_CLOSE]
    return request.model_copy(update=update)


def without_calls(
    request: TurnRequest,
    protocol: ToolProtocol,
    files: Mapping[str, str],
    answers: Mapping[str, Sequence[str]] | None = None,
) -> TurnRequest:
    """The request once the calls are spent: the model must answer."""
    update: dict = {"stop": [s for s in request.stop if s != TOOL_CALL_CLOSE], "tools": None}
    if protocol == "json":
        update["response_schema"] = answer_schema(answers or editable(files))
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
        self.retried = False  # its refused answer got the one call outside the budget
        self.largest_prompt = 0  # the largest prompt of its engine calls, in tokens

    def calls_left(self, budget: StepBudget) -> int:
        return 0 if self.stalled else budget.max_tool_calls - len(self.steps)

    def made(self, call: ParsedCall) -> bool:
        """Whether the turn already made this call (same tool, same arguments)."""
        return any(s.parsed and s.name == call.name and s.arguments == call.arguments for s in self.steps)

    def absorb(self, result: TurnResult) -> None:
        self.calls += 1
        self.largest_prompt = max(self.largest_prompt, result.tokens_in)
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
                "largest_prompt": self.largest_prompt,
                **({"content": content} if content is not None else {}),
            }
        )


def answer_patch(protocol: ToolProtocol, reply: str, answer: dict | None, files: Mapping[str, str]):
    """(the answer as it stands, with the built diff; why its edits did not all match, or "").
    No edits: the reply as it is (a unified diff in it stays the patch). An answer that builds no
    diff and gives no rationale (a `json` answer cut off by its token limit) stands as the reply
    it is: the agent answered, and its proposal is what it wrote, never an empty one."""
    if answer is not None:
        edits, why = edits_from_json(answer)
        rationale = str(answer.get("rationale", "")).strip()
        if why:
            return rationale or reply, f"error: {why}"
    else:
        edits, rationale = parse_edit_blocks(reply), ""
        if not edits:
            if extract_patch(reply) or not files:
                return reply, ""
            return reply, "error: the answer holds no edit: give each change as a search/replace block"
        rationale = rationale_of(reply.split("<<<<<<<")[0].rsplit("\n", 2)[0]).strip()
    outcome = apply_edits(files, edits)
    text = f"{rationale}\n\n```diff\n{outcome.patch}```\n" if outcome.patch else rationale or reply
    if outcome.failures:
        applied = f" The other edits matched ({', '.join(outcome.changed)})." if outcome.changed else ""
        return text, "error: " + "; ".join(outcome.failures) + "." + applied + (
            " Give all your edits again, each search text copied exactly from the file."
        )
    if not outcome.patch:
        return text, "error: the edits change nothing"
    return text, ""


@dataclass(frozen=True)
class _Room:
    """What a turn has left after a reply."""

    can_go_on: bool  # steps of its budget, time and tokens
    out_of_time: bool  # its budget's seconds spent, or no time for another call
    tokens_left: int


class ToolTurns:
    """A TurnRunner whose turns of `kinds` may call tools in `protocol` (`offer` False: none, the
    edits are still checked) and whose answers' edits on `files` (path -> text) become a patch;
    `run_step` runs single engine calls (without reporting ends: `on_result` sees each whole turn
    once, at its end); with a `meter`, every request is fitted to the engine's window. `focus`
    (path -> the texts, found once there, where the task points, `repomap.focus`): what a
    `json` answer's edits may search for, instead of every line of the code files. Turns that
    start with less time before the deliberation's `deadline` (epoch seconds) than their budget's
    `max_seconds` (as long as a whole turn may be) are offered no calls: they answer at once; a
    turn stops calling tools while the time it has left still holds two of its calls (one to be
    told, one to answer), and makes no further call when it holds less than 1.2 (its last reply
    stands: a call refused for the deadline would end the turn with nothing).

    One step a method: `_start` the turns, `_fit` each request to the window, send the waiting
    ones in one batch, and `_advance` each turn by its reply: `_room` (what it has left), its tool
    calls run (`_call_tools`), or its answer checked (`_answer`), or its result (`_finish`)."""

    def __init__(
        self,
        run_step: TurnRunner,
        execute: Execute,
        budget: StepBudget,
        kinds: frozenset[TurnKind] = TOOL_KINDS,
        protocol: ToolProtocol = "text",
        files: Mapping[str, str] | None = None,
        offer: bool = True,
        on_step: OnStep | None = None,
        on_result: Callable[[TurnResult], None] | None = None,
        meter: Meter | None = None,
        focus: Mapping[str, Sequence[str]] | None = None,
        deadline: float | None = None,
    ):
        self.run_step = run_step
        self.execute = execute
        self.budget = budget
        self.kinds = kinds
        self.protocol = protocol
        self.texts = dict(files or {})
        self.offer = offer
        self.on_step = on_step
        self.on_result = on_result
        self.meter = meter
        self.focus = focus
        self.deadline = deadline

    def __call__(self, requests: Sequence[TurnRequest]) -> list[TurnResult]:
        turns = self._start(requests)
        final: dict[int, TurnResult] = {}
        waiting = list(range(len(turns)))
        while waiting:
            sent = []
            for i in waiting:
                unsent = self._fit(turns[i])
                if unsent is None:
                    sent.append(i)
                else:
                    final[i] = unsent
            if not sent:
                break
            results = self.run_step([turns[i].request for i in sent])
            waiting = []
            for i, result in zip(sent, results, strict=True):
                done = self._advance(turns[i], result)
                if done is None:
                    waiting.append(i)
                else:
                    final[i] = done
        return [final[i] for i in range(len(turns))]

    def _start(self, requests: Sequence[TurnRequest]) -> list[_Turn]:
        """A turn for each request, offered the tools when it is of `kinds`; none offered when
        less time is left than a turn's budget (it answers at once)."""
        hurried = self.deadline is not None and self.deadline - time.time() < self.budget.max_seconds
        turns = []
        offer = self.offer and not hurried
        for r in requests:
            tooled = r.kind in self.kinds
            turn = _Turn(with_tools(r, self.protocol, self.texts, offer, self.focus) if tooled else r, tooled)
            turn.stalled = hurried
            turns.append(turn)
        return turns

    def _fit(self, turn: _Turn) -> TurnResult | None:
        """The turn's request fitted to the engine's window; the turn's result (FAILED, never
        sent) when it cannot be."""
        fitted = self._within_window(turn.request)
        if isinstance(fitted, str):
            unsent = TurnResult.unfinished(turn.request, TurnStatus.FAILED, fitted, CONTEXT_EXCEEDED)
            return self._finish(turn, unsent.model_copy(update={"attempts": 0}))
        turn.request = fitted
        return None

    def _within_window(self, request: TurnRequest) -> TurnRequest | str:
        """The request within the window (older tool results left out, the reply capped), or
        why it cannot fit."""
        meter = self.meter
        if meter is None:
            return request
        count = meter.count(request)
        while count is not None and count + request.max_tokens > meter.window:
            shorter = elide_oldest(request)
            if shorter is None:
                break
            request, count = shorter, meter.count(shorter)
        if count is None:
            return request
        left = meter.window - count
        if left < MIN_REPLY_TOKENS:
            return (
                f"request ({count} tokens) does not fit the engine's context window ({meter.window} "
                "tokens) with room for a reply, even with older tool results left out: not sent"
            )
        return request if request.max_tokens <= left else request.model_copy(update={"max_tokens": left})

    def _advance(self, turn: _Turn, result: TurnResult) -> TurnResult | None:
        """The turn moved on by its engine reply: its tool calls run, or its answer refused with
        why (in both the turn's next request waits for the engine: None), or its result."""
        turn.absorb(result)
        room = self._room(turn)
        if not (turn.tooled and result.ok):
            return self._finish(turn, result)
        calls, answer, broken = [], None, ""
        if self.protocol == "json":
            call, answer, broken = parse_json_reply(result.content)
            calls = [call] if call is not None else []
        elif self.offer:
            calls = parse_tool_calls(result.content)
        if calls and room.can_go_on and turn.calls_left(self.budget) > 0:
            self._call_tools(turn, result.content, calls, room.tokens_left)
            return None
        return self._answer(turn, result, answer, broken, room)

    def _room(self, turn: _Turn) -> _Room:
        """What the turn has left after a reply; it makes no more calls (stalled) once its time
        left holds fewer than two of its calls."""
        if self._late(turn, 2):
            turn.stalled = True  # no more tool calls: it answers next
        last_call = self._late(turn, 1.2)  # no time for another call: what it has now stands
        left = self.budget.max_tool_calls - len(turn.steps)  # steps: tool calls and refused answers
        out_of_time = time.monotonic() - turn.started >= self.budget.max_seconds or last_call
        tokens_left = self.budget.max_tokens - turn.tokens_out
        return _Room(left > 0 and not out_of_time and tokens_left > 0, out_of_time, tokens_left)

    def _late(self, turn: _Turn, calls: float) -> bool:
        """Whether what is left of the turn's time holds less than `calls` of its calls so far."""
        spent = time.monotonic() - turn.started
        left = self.budget.max_seconds - spent
        if self.deadline is not None:
            left = min(left, self.deadline - time.time())
        return left < calls * spent / max(turn.calls, 1)

    def _call_tools(self, turn: _Turn, reply: str, calls: list[ParsedCall], tokens_left: int) -> None:
        """The reply's calls run (as many as the budget has left); their results are the turn's
        next request."""
        ran = []
        for call in calls[: turn.calls_left(self.budget)]:
            start = time.monotonic()
            if call.error:
                step = ToolStep(
                    name=call.name or "?", text=call.text, parsed=False, output=f"error: {call.error}"
                )
            elif turn.made(call):  # its output is above: a model that repeats itself answers now
                turn.stalled = True
                step = ToolStep(name=call.name, arguments=call.arguments, output=REPEATED)
            else:
                output = self.execute(call.name, call.arguments)
                step = ToolStep(name=call.name, arguments=call.arguments, output=output)
            step.duration_ms = round((time.monotonic() - start) * 1000, 1)
            turn.tool_ms += step.duration_ms
            self._record(turn, step)
            ran.append(step)
        told = Message(role="user", content=results_message(ran, turn.calls_left(self.budget)))
        turn.request = self._next_request(turn, reply, ran, [told], tokens_left)

    def _answer(
        self, turn: _Turn, result: TurnResult, answer: dict | None, broken: str, room: _Room
    ) -> TurnResult | None:
        """The reply is the turn's answer: it stands (the turn's result) when its edits all match,
        when it is refused for the same reason twice, or when the turn has no room to try again;
        else it is refused with why and the turn asks again (None). An answer refused once the
        calls are spent gets one more call, outside the budget."""
        if broken:
            content, why = result.content, f"error: {broken}"
        else:
            content, why = answer_patch(self.protocol, result.content, answer, self.texts)
        repeated = why and why == turn.last_refusal  # the same answer again: no progress
        turn.last_refusal = why
        retry = not room.can_go_on and not turn.retried and not room.out_of_time  # outside the budget
        if not why or repeated or not (room.can_go_on or retry):
            return self._finish(turn, result, content)
        turn.retried = turn.retried or retry
        tokens_left = max(room.tokens_left, turn.request.max_tokens if retry else 0)
        step = ToolStep(name=EDIT_STEP, arguments={"answer": result.content[:200]}, output=why)
        self._record(turn, step)
        told = Message(role="user", content=results_message([step], turn.calls_left(self.budget)))
        turn.request = self._next_request(turn, result.content, [], [told], tokens_left)
        return None

    def _record(self, turn: _Turn, step: ToolStep) -> None:
        turn.steps.append(step)
        if self.on_step is not None:
            self.on_step(turn.request, step)

    def _finish(self, turn: _Turn, result: TurnResult, content: str | None = None) -> TurnResult:
        done = turn.finish(result, content)
        if self.on_result is not None:
            self.on_result(done)
        return done

    def _next_request(
        self, turn: _Turn, reply: str, ran: list[ToolStep], answers: list[Message], tokens_left: int
    ) -> TurnRequest:
        """The turn's next engine call: its history, the reply that made the calls, their results
        (native calls: each a `tool` message); no more calls offered once the budget is spent."""
        if self.protocol == "openai" and ran:
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
                    Message(role="tool", tool_call_id=n["id"], content=page(step.output))
                    for n, step in zip(native, ran, strict=False)
                ),
            ]
        else:
            messages = [*waiting_messages(turn, reply), *answers]
        request = turn.request.model_copy(
            update={"messages": messages, "max_tokens": min(turn.request.max_tokens, tokens_left)}
        )
        if turn.calls_left(self.budget) <= 0:
            request = without_calls(request, self.protocol, self.texts, self.focus)
        elif self.protocol == "json":
            read = frozenset(str(s.arguments.get("path")) for s in turn.steps if read_whole(s, self.texts))
            request = request.model_copy(
                update={"response_schema": turn_schema(self.texts, read, self.focus)}
            )
        return request


def waiting_messages(turn: _Turn, reply: str) -> list[Message]:
    """The turn's history so far with the reply that made the calls (a text call closed, as the
    stop sequence cut it)."""
    closed = reply
    if TOOL_CALL_CLOSE in turn.request.stop and not reply.rstrip().endswith(TOOL_CALL_CLOSE):
        closed = reply.rstrip() + TOOL_CALL_CLOSE if "<tool_call>" in reply else reply
    return [*turn.request.messages, Message(role="assistant", content=closed)]


def read_whole(step: ToolStep, files: Mapping[str, str]) -> bool:
    """Whether the step read a whole file (one short enough for one read): reading it again shows
    nothing new."""
    if step.name != "read_file" or step.output.startswith("error"):
        return False
    text = files.get(str(step.arguments.get("path")), "")
    return not step.arguments.get("symbol") and len(text.splitlines()) <= READ_WINDOW_LINES


def elide_oldest(request: TurnRequest) -> TurnRequest | None:
    """The request one step shorter, the latest exchange (the last reply and what answered it)
    kept whole longest: the oldest tool result still shown of an earlier exchange left out (a
    note in its place); else the oldest earlier exchange left out whole (its reply too, which a
    small window cannot keep: the model's own replies grow the history as much as the results);
    else the latest exchange's results. None when nothing is left to leave out."""
    messages = list(request.messages)
    replies = [n for n, m in enumerate(messages) if m.role == "assistant"]
    if not replies:
        return None
    latest = replies[-1]
    earlier = [n for n in range(replies[0], latest) if _shown_result(messages[n])]
    if not earlier and len(replies) > 1:
        return request.model_copy(update={"messages": messages[: replies[0]] + messages[replies[1] :]})
    shown = earlier or [n for n in range(latest, len(messages)) if _shown_result(messages[n])]
    if not shown:
        return None
    messages[shown[0]] = messages[shown[0]].model_copy(update={"content": ELIDED})
    return request.model_copy(update={"messages": messages})


def _shown_result(message: Message) -> bool:
    """A tool result (a `tool` message, or the user message the text protocols answer with) not
    left out yet."""
    is_result = message.role == "tool" or (
        message.role == "user" and message.content.startswith(RESULT_PREFIX)
    )
    return is_result and message.content != ELIDED
