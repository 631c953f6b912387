"""Agent turns with tools: a `TurnRunner` that runs each turn as engine calls and tool calls in
turn, until a reply holds no call or the step budget is spent (`domain.tools`).

Every engine call goes through the runner it wraps (the admission queue, the deadline), in
batches: all turns waiting for the engine go together. Tool calls run through `execute` (the
sandbox, against the read-only workspace). The finished turn's result carries its last reply,
every tool step, and the tokens and engine time of all its calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .deliberation import TurnRunner
from .models import Message, TurnKind, TurnRequest, TurnResult
from .tools import (
    TOOL_CALL_CLOSE,
    StepBudget,
    ToolStep,
    parse_tool_calls,
    results_message,
    tools_instruction,
)

TOOL_KINDS = frozenset({TurnKind.PROPOSE, TurnKind.REVISE})  # turns that write a patch
Execute = Callable[[str, dict], str]
"""Runs one tool (name, arguments) and returns its output."""
OnStep = Callable[[TurnRequest, ToolStep], None]


def with_tools(request: TurnRequest, openai_tools: list[dict] | None) -> TurnRequest:
    """The request with the tool protocol: the instruction in its last user message, the stop
    sequence that ends a call, and the OpenAI `tools` where the engine calls tools natively."""
    messages = list(request.messages)
    last = messages[-1]
    messages[-1] = Message(role=last.role, content=f"{last.content}\n\n{tools_instruction()}")
    return request.model_copy(
        update={"messages": messages, "stop": [*request.stop, TOOL_CALL_CLOSE], "tools": openai_tools}
    )


class _Turn:
    def __init__(self, request: TurnRequest):
        self.request = request
        self.steps: list[ToolStep] = []
        self.tokens_in = self.tokens_out = 0
        self.latency_ms = self.queue_ms = self.tool_ms = 0.0
        self.calls = 0
        self.started = time.monotonic()

    def absorb(self, result: TurnResult) -> None:
        self.calls += 1
        self.tokens_in += result.tokens_in
        self.tokens_out += result.tokens_out
        self.latency_ms += result.latency_ms
        self.queue_ms += result.queue_ms

    def finish(self, result: TurnResult) -> TurnResult:
        return result.model_copy(
            update={
                "tool_steps": self.steps,
                "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out,
                "latency_ms": self.latency_ms,
                "queue_ms": self.queue_ms,
                "tool_ms": self.tool_ms,
                "engine_calls": self.calls,
            }
        )


def tool_turns(
    run_step: TurnRunner,
    execute: Execute,
    budget: StepBudget,
    kinds: frozenset[TurnKind] = TOOL_KINDS,
    openai_tools: list[dict] | None = None,
    on_step: OnStep | None = None,
    on_result: Callable[[TurnResult], None] | None = None,
) -> TurnRunner:
    """A TurnRunner whose turns of `kinds` may call tools (the text protocol, plus `openai_tools`
    for an engine that calls tools natively); `run_step` runs single engine calls (without
    reporting ends: `on_result` sees each whole turn once, at its end)."""

    def run(requests: Sequence[TurnRequest]) -> list[TurnResult]:
        turns = [_Turn(with_tools(r, openai_tools) if r.kind in kinds else r) for r in requests]
        final: dict[int, TurnResult] = {}
        waiting = {i: t.request for i, t in enumerate(turns)}
        while waiting:
            order = list(waiting)
            results = run_step([waiting[i] for i in order])
            waiting = {}
            for i, result in zip(order, results, strict=True):
                turn = turns[i]
                turn.absorb(result)
                offered = TOOL_CALL_CLOSE in turn.request.stop or turn.steps
                calls = parse_tool_calls(result.content) if result.ok and offered else []
                spent_calls = len(turn.steps) >= budget.max_tool_calls
                out_of_time = time.monotonic() - turn.started >= budget.max_seconds
                tokens_left = budget.max_tokens - turn.tokens_out
                if not calls or spent_calls or out_of_time or tokens_left <= 0:
                    final[i] = turn.finish(result)
                    if on_result is not None:
                        on_result(final[i])
                    continue
                ran = []
                for call in calls[: budget.max_tool_calls - len(turn.steps)]:
                    start = time.monotonic()
                    if call.error:
                        step = ToolStep(
                            name=call.name or "?", text=call.text, parsed=False, output=f"error: {call.error}"
                        )
                    else:
                        step = ToolStep(
                            name=call.name,
                            arguments=call.arguments,
                            output=execute(call.name, call.arguments),
                        )
                    step.duration_ms = round((time.monotonic() - start) * 1000, 1)
                    turn.tool_ms += step.duration_ms
                    turn.steps.append(step)
                    ran.append(step)
                    if on_step is not None:
                        on_step(turn.request, step)
                left = budget.max_tool_calls - len(turn.steps)
                messages = [
                    *waiting_messages(turn, result.content),
                    Message(role="user", content=results_message(ran, left)),
                ]
                turn.request = turn.request.model_copy(
                    update={
                        "messages": messages,
                        "max_tokens": min(turn.request.max_tokens, tokens_left),
                        # with the budget spent, the model answers: no more calls offered
                        **(
                            {"stop": [s for s in turn.request.stop if s != TOOL_CALL_CLOSE], "tools": None}
                            if left <= 0
                            else {}
                        ),
                    }
                )
                waiting[i] = turn.request
        return [final[i] for i in range(len(turns))]

    return run


def waiting_messages(turn: _Turn, reply: str) -> list[Message]:
    """The turn's history so far with the reply that made the calls (closed, as the stop
    sequence cut it)."""
    closed = reply if reply.rstrip().endswith(TOOL_CALL_CLOSE) else reply.rstrip() + TOOL_CALL_CLOSE
    return [*turn.request.messages, Message(role="assistant", content=closed)]
