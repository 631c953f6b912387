"""The tool loop of an agent turn (pure): calls parsed or kept as text, the step budget, the
history each turn keeps, and one engine batch per step for all waiting turns."""

from __future__ import annotations

from fleet_pipelines.domain.models import Message, Role, TurnKind, TurnRequest
from fleet_pipelines.domain.tool_turns import tool_turns
from fleet_pipelines.domain.tools import TOOL_CALL_CLOSE, StepBudget, ToolSpec, parse_tool_calls, render_call
from tests.scripted import ScriptedEngine

READ = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'


def request(agent: str, kind: TurnKind = TurnKind.PROPOSE) -> TurnRequest:
    return TurnRequest(
        task_id="t",
        agent_id=agent,
        role=Role.DEV,
        kind=kind,
        round=0,
        messages=[Message(role="user", content="fix it")],
        temperature=0.0,
        max_tokens=100,
    )


def run(replies: dict[str, list[str]], budget: StepBudget, agents=("a1",), kinds=None):
    engine = ScriptedEngine(tool_replies=replies)
    executed: list[tuple[str, dict]] = []

    def execute(name: str, arguments: dict) -> str:
        executed.append((name, arguments))
        return f"output of {name}"

    runner = tool_turns(engine, execute, budget)
    results = runner([request(a, k) for a in agents for k in (kinds or [TurnKind.PROPOSE])])
    return results, executed, engine


def test_a_turn_calls_tools_then_answers_and_keeps_its_history():
    results, executed, engine = run(
        {"a1": [READ, "no call: " + READ.replace("<tool_call>", "")]}, StepBudget()
    )
    [result] = results
    assert executed == [("read_file", {"path": "a.py"})]
    assert [s.name for s in result.tool_steps] == ["read_file"] and result.tool_steps[
        0
    ].output == "output of read_file"
    assert result.engine_calls == 2 and result.content.startswith("no call")
    second = engine.batches[1][0]
    assert second.messages[-2].role == "assistant" and second.messages[-2].content.endswith(TOOL_CALL_CLOSE)
    assert "Result of read_file" in second.messages[-1].content
    assert (
        TOOL_CALL_CLOSE in engine.batches[0][0].stop
        and "You may call tools" in engine.batches[0][0].messages[-1].content
    )


def test_unparseable_calls_are_kept_as_text_and_count_against_the_budget():
    garbage = ["<tool_call>{oops</tool_call>"] * 5
    results, executed, engine = run({"a1": garbage}, StepBudget(max_tool_calls=2))
    [result] = results
    assert executed == []
    assert [(s.parsed, s.text) for s in result.tool_steps] == [(False, "{oops")] * 2
    assert result.engine_calls == 3  # two calls spent the budget; the third reply stands
    last = engine.batches[-1][0]
    assert "budget is spent" in last.messages[-1].content and TOOL_CALL_CLOSE not in last.stop


def test_the_token_budget_ends_a_turn():
    results, _, _ = run({"a1": [READ] * 10}, StepBudget(max_tokens=8))
    [result] = results
    assert result.tokens_out >= 8 and result.engine_calls < 10


def test_waiting_turns_share_one_engine_batch_per_step_and_other_kinds_get_no_tools():
    results, _, engine = run(
        {"a1": [READ, READ], "a2": [READ]}, StepBudget(), agents=("a1", "a2", "a3"), kinds=[TurnKind.PROPOSE]
    )
    assert [len(b) for b in engine.batches] == [3, 2, 1]
    assert [r.engine_calls for r in results] == [3, 2, 1]
    critique = run({"a1": [READ]}, StepBudget(), kinds=[TurnKind.CRITIQUE])[0][0]
    assert critique.engine_calls == 1 and not critique.tool_steps


def test_structured_calls_render_in_the_text_form():
    text = render_call("search_text", '{"text": "def add"}')
    [call] = parse_tool_calls(text)
    assert (call.name, call.arguments, call.error) == ("search_text", {"text": "def add"}, "")
    [unknown] = parse_tool_calls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>')
    assert "unknown tool" in unknown.error
    spec = ToolSpec(name="x", description="d", parameters={"type": "object", "properties": {}})
    assert spec.openai()["function"]["name"] == "x"
