"""The scripted engine: a TurnRunner double that answers every turn at once, without an engine.

`ScriptedEngine` serves the domain tests (a callable TurnRunner); `ScriptedTurnRunner` is the
same as the `turn_runner` resource, so a whole deliberation_job runs in a unit test.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import Field, PrivateAttr

from fleet_pipelines.domain.deliberation import TurnContext
from fleet_pipelines.domain.models import TurnKind, TurnRequest, TurnResult, TurnStatus
from fleet_pipelines.resources.turns import TurnRunnerResource


class ScriptedEngine:
    """Answers each turn with text naming it (proposals and revisions add `code` as a Python
    block; the judge gives `judge_score`), fails chosen (agent, kind) pairs, times out one kind."""

    def __init__(
        self,
        fail: set[tuple[str, TurnKind]] | None = None,
        timeout_kind: TurnKind | None = None,
        code: str = "",
        judge_score: float = 7,
        patches: dict[str, str] | None = None,
        tool_replies: dict[str, list[str]] | None = None,
    ):
        self.fail = fail or set()
        self.timeout_kind = timeout_kind
        self.code = code
        self.patches = patches or {}
        self.tool_replies = tool_replies or {}
        self.judge_score = judge_score
        self.batches: list[list[TurnRequest]] = []

    def text(self, r: TurnRequest) -> str:
        if r.kind is TurnKind.JUDGE:
            return json.dumps(
                {"score": self.judge_score, "rationale": f"scripted verdict on {r.target_agent_id}"}
            )
        step = sum(m.role == "assistant" for m in r.messages)  # engine calls of this turn so far
        scripted = self.tool_replies.get(r.agent_id, [])
        if r.kind is TurnKind.PROPOSE and step < len(scripted):
            return scripted[step]
        text = f"{r.kind.value} by {r.agent_id} round {r.round} on {r.target_agent_id}"
        if self.code and r.kind in (TurnKind.PROPOSE, TurnKind.REVISE):
            text += f"\n\n```python\n{self.code}\n```\n"
        if r.agent_id in self.patches and r.kind in (TurnKind.PROPOSE, TurnKind.REVISE):
            text += f"\n\n```diff\n{self.patches[r.agent_id]}```\n"
        return text

    def __call__(self, requests: Sequence[TurnRequest]) -> list[TurnResult]:
        self.batches.append(list(requests))
        results = []
        for r in requests:
            if r.kind is self.timeout_kind:
                results.append(TurnResult.unfinished(r, TurnStatus.TIMEOUT, "deadline", "Timeout"))
            elif (r.agent_id, r.kind) in self.fail:
                results.append(TurnResult.unfinished(r, TurnStatus.FAILED, "boom", "InternalServerError"))
            else:
                text = self.text(r)
                results.append(
                    TurnResult.for_request(
                        r, TurnStatus.COMPLETED, content=text, model="scripted", tokens_out=len(text.split())
                    )
                )
        return results


class ScriptedTurnRunner(TurnRunnerResource):
    """The `turn_runner` resource of unit tests: the scripted engine in place of Ray and an engine."""

    code: str = Field(default="", description="Python each proposal and revision carries.")
    judge_score: float = Field(default=7, description="The judge's score of every proposal (0-10).")
    fail_agents: list[str] = Field(default_factory=list, description="Agents whose every turn fails.")
    patches: dict[str, str] = Field(
        default_factory=dict, description="Per agent, the unified diff its proposals and revisions carry."
    )
    tool_replies: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Per agent, the replies (tool calls) its proposal turn makes before its answer.",
    )
    record_to: str = Field(default="", description="A file each request is appended to, one JSON line each.")
    _engine: ScriptedEngine = PrivateAttr()

    def setup_for_execution(self, context) -> None:
        fail = {(agent, kind) for agent in self.fail_agents for kind in TurnKind}
        self._engine = ScriptedEngine(
            fail=fail,
            code=self.code,
            judge_score=self.judge_score,
            patches=self.patches,
            tool_replies=self.tool_replies,
        )

    @property
    def model_name(self) -> str:
        return "scripted"

    def run_turns(self, requests: Sequence[TurnRequest], turn: TurnContext) -> list[TurnResult]:
        """The scripted answers, recorded with the council's engine's model when it has one; each
        turn's text as one chunk, then its end, as the Ray runner reports them (the deadline and
        the claim are not looked at)."""
        record(self.record_to, requests)
        results = self._engine(requests)
        if turn.engine is not None:
            results = [r.model_copy(update={"model": turn.engine.model}) for r in results]
        for request, result in zip(requests, results, strict=True):
            if turn.on_chunk is not None and result.content:
                turn.on_chunk(request, 0, result.content, result.tokens_out)
            if turn.on_result is not None:
                turn.on_result(result)
        return results


def record(path: str, requests: Sequence[TurnRequest]) -> None:
    """Appends the requests to `path` (when given), so a test reads what each agent was sent."""
    if path:
        with open(path, "a") as out:
            out.writelines(r.model_dump_json() + "\n" for r in requests)


def recorded(path) -> list[TurnRequest]:
    with open(path) as lines:
        return [TurnRequest.model_validate_json(line) for line in lines]
