"""Live progress of a step's turns, fed by the dispatcher as they stream and end.

* token chunks on `vllm.streaming.{task_id}` (stream VLLM_STREAMING), as the admission queue cut
  them (a few per second per turn), then a closing chunk with the turn's status;
* `agent.response.completed|failed` for each agent turn as soon as it ends (acked; what NATS does
  not take waits in the outbox and is sent when it is back: a NATS outage never fails a run);
* the Dagster run log: one line per finished turn with its queue wait beside its service time
  (what `fleet result --follow` prints), and every few seconds the tokens each turn has streamed.

The run publishes, not the workers: chunks come back to the run through the queue actor's polls
(Ray Client cannot carry streaming generators), so workers need no NATS connection or credentials.
"""

from __future__ import annotations

import json
import time

import dagster as dg

from ..domain.models import Task, TurnKind, TurnRequest, TurnResult, turn_label
from ..domain.tools import ToolStep, step_line
from ..events.outbound import agent_response_events, turn_chunk_event
from ..names import TAG_CAUSATION, TAG_CORRELATION, TURN_LOG_PREFIX
from ..resources.events import EventSink


def turn_log_line(result: TurnResult) -> str:
    why = f" ({result.error_type}: {result.error})" if result.error else ""
    return (
        f"{TURN_LOG_PREFIX}{turn_label(result)}: {result.status.value}, {result.tokens_out} tokens, "
        f"queue {result.queue_ms / 1000:.1f} s, service {result.latency_ms / 1000:.1f} s{why}"
    )


class TurnProgress:
    def __init__(
        self,
        context: dg.AssetExecutionContext,
        publisher: EventSink,
        task: Task,
        log_every_s: float = 5.0,
    ):
        self.context = context
        self.publisher = publisher
        self.task = task
        self.log_every_s = log_every_s
        self._streamed: dict[str, int] = {}  # tokens streamed so far, by turn label
        self._next_seq: dict[str, int] = {}
        self._base_seq: dict[str, int] = {}  # a turn with tools: its next engine call's chunks follow
        self._logged_at = time.monotonic()

    def on_chunk(self, request: TurnRequest, seq: int, text: str, tokens: int) -> None:
        label = turn_label(request)
        seq += self._base_seq.get(label, 0)
        self.publisher.publish_nowait(
            *turn_chunk_event(self.task.task_id, self.context.run_id, request, seq, text, tokens)
        )
        self._streamed[label] = self._streamed.get(label, 0) + tokens
        self._next_seq[label] = seq + 1
        if time.monotonic() - self._logged_at >= self.log_every_s:
            self._logged_at = time.monotonic()
            self.context.log.info(
                "streaming: " + "; ".join(f"{label} {n} tokens" for label, n in self._streamed.items())
            )

    def on_tool(self, request: TurnRequest, step: ToolStep) -> None:
        """A tool call and its result, as a chunk of the turn's stream and a line of the run log."""
        label = turn_label(request)
        seq = self._next_seq.get(label, 0)
        call = json.dumps(step.arguments) if step.parsed else repr(step.text[:200])
        text = f"\n[tool {step.name} {call} ({step.duration_ms:.0f} ms)]\n{step.output[:1_000]}\n[/tool]\n"
        self.publisher.publish_nowait(
            *turn_chunk_event(self.task.task_id, self.context.run_id, request, seq, text, 0)
        )
        self._next_seq[label] = self._base_seq[label] = seq + 1
        self.context.log.info(f"{TURN_LOG_PREFIX}{label}: tool {step_line(step)}")

    def on_result(self, result: TurnResult) -> None:
        label = turn_label(result)
        self._streamed.pop(label, None)
        self._base_seq.pop(label, None)
        seq = self._next_seq.pop(label, 0)
        self.publisher.publish_nowait(
            *turn_chunk_event(self.task.task_id, self.context.run_id, result, seq, "", 0, result.status)
        )
        if result.kind is not TurnKind.JUDGE:  # judge turns are scoring, not agent responses
            tags = self.context.run_tags
            self.publisher.publish(
                agent_response_events(
                    self.task,
                    [result],
                    self.context.run_id,
                    tags.get(TAG_CORRELATION),
                    tags.get(TAG_CAUSATION),
                )
            )
        self.context.log.info(turn_log_line(result))
