"""The tool loop of an agent turn (pure): calls parsed or kept as text, the step budget, the
history each turn keeps, and one engine batch per step for all waiting turns."""

from __future__ import annotations

import json

from fleet_pipelines.domain.models import Message, Role, TurnKind, TurnRequest
from fleet_pipelines.domain.tool_turns import ToolTurns
from fleet_pipelines.domain.tools import (
    TOOL_CALL_CLOSE,
    StepBudget,
    ToolSpec,
    ToolStep,
    parse_tool_calls,
    render_call,
    step_line,
)
from fleet_pipelines.domain.workspace import extract_patch
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

    runner = ToolTurns(engine, execute, budget)
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


CALC = "def add(a, b):\n    return a - b\n"
FILES = {"calc.py": CALC}
ANSWER = json.dumps(
    {
        "edits": [{"path": "calc.py", "search": "    return a - b", "replace": "return a + b"}],
        "rationale": "sign",
    }
)


def run_json(replies: list[str], protocol="json"):
    engine = ScriptedEngine(tool_replies={"a1": replies})
    executed: list[tuple[str, dict]] = []

    def execute(name: str, arguments: dict) -> str:
        executed.append((name, arguments))
        return CALC

    runner = ToolTurns(engine, execute, StepBudget(), protocol=protocol, files=FILES)
    [result] = runner([request("a1")])
    return result, executed, engine


def test_a_json_turn_is_schema_constrained_and_its_edits_become_the_patch():
    call = json.dumps({"tool": "read_file", "arguments": {"path": "calc.py"}})
    result, executed, engine = run_json([call, ANSWER])
    assert executed == [("read_file", {"path": "calc.py"})]
    first = engine.batches[0][0]
    schema = first.response_schema
    assert schema is not None and first.tools is None and TOOL_CALL_CLOSE not in first.stop
    answer = schema["anyOf"][-1]["properties"]["edits"]["items"]
    assert answer["properties"]["search"] == {"enum": ["def add(a, b):", "    return a - b"]}
    assert result.content.startswith("sign\n\n```diff\n")
    assert extract_patch(result.content) == (
        "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
        " def add(a, b):\n-    return a - b\n+    return a + b\n"
    )


def test_an_edit_that_does_not_match_is_answered_and_the_turn_goes_on():
    wrong = json.dumps(
        {"edits": [{"path": "calc.py", "search": "return a * b", "replace": "x"}], "rationale": "r"}
    )
    result, _, engine = run_json([wrong, ANSWER])
    [step] = result.tool_steps
    assert step.name == "edit" and step.output.startswith(
        "error: edit 1 (calc.py): the search text is not in"
    )
    assert "Result of edit" in engine.batches[1][0].messages[-1].content
    assert extract_patch(result.content)


def test_text_blocks_become_the_patch_and_a_models_diff_stays():
    block = (
        "Fix the sign.\n\ncalc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n"
        "    return a + b\n>>>>>>> REPLACE\n"
    )
    result, _, engine = run_json([block], protocol="text")
    assert engine.batches[0][0].response_schema is None
    assert "+    return a + b" in extract_patch(result.content)
    diff = (
        "```diff\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
        "-    return a - b\n+    x\n```"
    )
    assert run_json([diff], protocol="text")[0].content == diff


def test_a_reply_cut_off_mid_json_is_answered_not_run():
    result, executed, _ = run_json(['{"tool": "read_file", "argu', ANSWER])
    assert executed == [] and result.tool_steps[0].output.startswith(
        "error: the reply is not one JSON object"
    )
    assert extract_patch(result.content)


def test_an_answer_cut_off_after_whole_edits_keeps_them():
    cut = ANSWER.split('"rationale"')[0].rstrip(", ]") + ', {"path": "calc.py", "sea'
    result, _, engine = run_json([cut])
    assert len(engine.batches) == 1 and "+    return a + b" in extract_patch(result.content)


def test_a_cut_answer_whose_edits_change_nothing_stands_as_written():
    """Cut off by its token limit (no rationale) with a no-op edit, refused, then the same again:
    the turn's proposal is the reply it wrote, never an empty one that the decision would not
    count (CI: the agent with this answer was left out, and a 2-agent quorum failed)."""
    noop = '{"edits": [{"path": "calc.py", "search": "    return a - b", "replace": "    return a - b"}'
    result, _, engine = run_json([noop, noop])
    assert len(engine.batches) == 2 and result.tool_steps[0].output.startswith("error: edit 1")
    assert result.ok and result.content == noop and not extract_patch(result.content)


def test_native_calls_are_answered_as_tool_messages():
    call = render_call("read_file", '{"path": "calc.py"}', call_id="call_7")
    result, executed, engine = run_json(
        [call, "calc.py\n<<<<<<< SEARCH\na - b\n=======\na + b\n>>>>>>> REPLACE"], protocol="openai"
    )
    assert executed == [("read_file", {"path": "calc.py"})]
    assert engine.batches[0][0].tools and engine.batches[0][0].response_schema is None
    assistant, answer = engine.batches[1][0].messages[-2:]
    assert assistant.role == "assistant" and assistant.tool_calls[0]["id"] == "call_7"
    assert assistant.tool_calls[0]["function"] == {"name": "read_file", "arguments": '{"path": "calc.py"}'}
    assert (answer.role, answer.tool_call_id, answer.content) == ("tool", "call_7", CALC)
    assert answer.wire() == {"role": "tool", "content": CALC, "tool_call_id": "call_7"}
    assert "+    return a + b" in extract_patch(result.content)


def test_a_step_line_is_one_line_with_outcome_and_time():
    step = ToolStep(
        name="read_file", arguments={"path": "calc.py"}, output="1: def add\n2: x", duration_ms=1234
    )
    assert step_line(step) == 'read_file {"path": "calc.py"} -> 1: def add (1.2 s)'


def test_a_json_turn_reads_each_file_once():
    call = json.dumps({"tool": "read_file", "arguments": {"path": "calc.py"}})
    _, _, engine = run_json([call, ANSWER])
    offered = [o["properties"]["tool"]["const"] for o in engine.batches[1][0].response_schema["anyOf"][:-1]]
    assert offered == ["search_text"]  # calc.py was read: no read_file left to offer


def test_a_call_made_again_is_not_run_and_the_turn_must_answer():
    search = json.dumps({"tool": "search_text", "arguments": {"text": "add"}})
    result, executed, engine = run_json([search, search, ANSWER])
    assert executed == [("search_text", {"text": "add"})]  # the repeat never reached the tools
    assert [s.output.startswith("error: this call was made before") for s in result.tool_steps] == [
        False,
        True,
    ]
    last = engine.batches[-1][0]
    assert "budget is spent" in last.messages[-1].content
    assert "anyOf" not in last.response_schema  # only the answer's schema: no call offered any more
    assert result.engine_calls == 3 and "return a + b" in extract_patch(result.content)


def test_a_text_call_made_again_ends_the_calls_of_the_turn():
    results, executed, engine = run({"a1": [READ, READ, READ, "my answer"]}, StepBudget(max_tool_calls=6))
    [result] = results
    assert executed == [("read_file", {"path": "a.py"})]
    assert result.engine_calls == 3 and TOOL_CALL_CLOSE not in engine.batches[-1][0].stop
