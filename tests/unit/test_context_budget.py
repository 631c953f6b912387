"""Every request fits the engine's window (pure parts): tool output paged (reads by line range or
symbol with a default window, search hits capped, long output cut head and tail with a note),
older tool results and then earlier exchanges left out when the window runs low (the latest
exchange kept whole longest), a request that cannot fit never sent, a refused final answer
retried once outside the call budget; the file index without what no one edits and the
repository map ranked by the task and the failing tests within its budget."""

from __future__ import annotations

import json
import time

from fleet_pipelines.domain.decision import decide
from fleet_pipelines.domain.models import (
    DeliberationStatus,
    Message,
    Role,
    Task,
    TurnKind,
    TurnRequest,
    TurnResult,
    TurnStatus,
)
from fleet_pipelines.domain.repomap import approx_tokens, focus, indexed, repo_map, seeds
from fleet_pipelines.domain.tool_turns import CONTEXT_EXCEEDED, ELIDED, ToolTurns, elide_oldest
from fleet_pipelines.domain.tools import (
    MAX_SEARCH_HITS,
    READ_WINDOW_LINES,
    StepBudget,
    page,
    read_text,
    search_texts,
)
from fleet_pipelines.domain.workspace import extract_patch
from tests import factories
from tests.scripted import ScriptedEngine

BIG = "".join(f"def f{n}(x):\n    return x + {n}\n\n" for n in range(200))  # 600 lines
TEXTS = {
    "pkg/big.py": BIG,
    "tests/test_big.py": "from pkg.big import f7\n\n\ndef test_f7():\n    assert f7(1) == 8\n",
}


def test_long_output_keeps_head_and_tail_and_says_what_was_left_out():
    text = "\n".join(f"line {n}" for n in range(2_000))
    cut = page(text, 600)
    assert len(cut) <= 600 and cut.startswith("line 0\n") and cut.endswith("line 1999")
    assert "lines left out" in cut
    assert page("short", 600) == "short"


def test_a_read_shows_a_window_of_lines_or_one_symbol():
    window = read_text(TEXTS, {"path": "pkg/big.py"})
    assert window.splitlines()[0] == "1: def f0(x):"
    assert f"{READ_WINDOW_LINES}:" in window and f"{READ_WINDOW_LINES + 1}:" not in window
    assert "of 600; read on with start_line" in window
    later = read_text(TEXTS, {"path": "pkg/big.py", "start_line": 301, "end_line": 303})
    assert later.splitlines()[:3] == ["301: def f100(x):", "302:     return x + 100", "303: "]
    assert read_text(TEXTS, {"path": "pkg/big.py", "symbol": "f150"}) == (
        "451: def f150(x):\n452:     return x + 150"
    )
    assert read_text(TEXTS, {"path": "pkg/big.py", "symbol": "nope"}).startswith("error: no function")
    assert read_text(TEXTS, {"path": "pkg.egg-info/PKG-INFO"}).startswith("error: no text file")


def test_search_hits_are_capped_with_a_count_of_the_rest():
    hits = search_texts(TEXTS, {"text": "return x"}).splitlines()
    assert len(hits) == MAX_SEARCH_HITS + 1 and hits[0] == "pkg/big.py:2: return x + 0"
    assert hits[-1] == f"({200 - MAX_SEARCH_HITS} more matches not shown: search a longer text)"


def test_the_index_leaves_out_what_no_one_edits():
    kept = ["pkg/big.py", "tests/test_big.py", "setup.py", ".github/workflows/ci.yml"]
    left_out = [
        ".git/config",
        "pkg.egg-info/SOURCES.txt",
        "build/lib/pkg/big.py",
        "dist/pkg-1.0.tar.gz",
        "pkg/__pycache__/big.cpython-311.pyc",
        "src/pkg/_vendor/six.py",
        ".tox/py311/lib/x.py",
    ]
    assert all(indexed(p) for p in kept) and not any(indexed(p) for p in left_out)


def test_the_map_puts_the_function_the_failing_tests_name_first_within_its_budget():
    found = seeds("", ["tests/test_big.py::test_f150"], 'File "/work/repo/pkg/big.py", line 452, in f150')
    assert "f150" in found.names and "pkg/big.py" in found.files
    paths = [*TEXTS, "pkg.egg-info/PKG-INFO", "README.rst"]
    text = repo_map(TEXTS, paths, "f150 adds the wrong number", ["tests/test_big.py::test_f150"], "", 150)
    assert text.startswith("--- pkg/big.py, def f150 (lines 451-452) ---\n451: def f150(x):")
    assert "pkg.egg-info" not in text and approx_tokens(text) <= 150 + 20  # the last line counts what is left
    assert text.splitlines()[-1] == "(3 more files not listed; list_files shows them)" or "README.rst" in text


class WordMeter:
    """A meter for the pure loop: a window of `window` "tokens", one per word of the messages (the
    engine's own count is tested on llama.cpp in tests/integration/test_context_window.py)."""

    def __init__(self, window: int):
        self.window = window
        self.counted: list[int] = []

    def count(self, request: TurnRequest) -> int:
        n = sum(len(m.content.split()) for m in request.messages)
        self.counted.append(n)
        return n


def request(max_tokens: int = 20) -> TurnRequest:
    return TurnRequest(
        task_id="t",
        agent_id="a1",
        role=Role.DEV,
        kind=TurnKind.PROPOSE,
        round=0,
        messages=[Message(role="system", content="s"), Message(role="user", content="fix it")],
        temperature=0.0,
        max_tokens=max_tokens,
    )


def search(n: int) -> str:
    return json.dumps({"tool": "search_text", "arguments": {"text": f"x{n}"}})


ANSWER = json.dumps(
    {
        "edits": [{"path": "calc.py", "search": "    return a - b", "replace": "    return a + b"}],
        "rationale": "r",
    }
)
FILES = {"calc.py": "def add(a, b):\n    return a - b\n"}


def run(replies: list[str], meter: WordMeter, budget: StepBudget | None = None, max_tokens: int = 20):
    engine = ScriptedEngine(tool_replies={"a1": replies})

    def execute(name: str, arguments: dict) -> str:
        return "word " * 150  # a long tool result

    runner = ToolTurns(engine, execute, budget or StepBudget(), protocol="json", files=FILES, meter=meter)
    [result] = runner([request(max_tokens)])
    return result, engine


def test_older_tool_results_are_left_out_when_the_window_runs_low():
    meter = WordMeter(window=450)
    result, engine = run([search(1), search(2), search(3), ANSWER], meter)
    assert result.status is TurnStatus.COMPLETED and extract_patch(result.content)
    last = engine.batches[-1][0]
    contents = [m.content for m in last.messages]
    assert contents.count(ELIDED) >= 1 and contents[-1].startswith("Result of search_text")
    assert all(meter.count(r) + r.max_tokens <= meter.window for batch in engine.batches for r in batch)


def test_the_reply_is_capped_to_what_the_window_leaves():
    meter = WordMeter(window=200)
    _, engine = run([ANSWER], meter, max_tokens=500)
    sent = engine.batches[0][0]
    assert sent.max_tokens == 200 - meter.count(sent)


def test_a_request_that_cannot_fit_is_never_sent_and_the_turn_says_why():
    meter = WordMeter(window=60)  # the tool instruction alone is longer
    result, engine = run([search(1), ANSWER], meter)
    assert engine.batches == []
    assert result.status is TurnStatus.FAILED and result.error_type == CONTEXT_EXCEEDED
    assert "does not fit the engine's context window (60 tokens)" in result.error and result.attempts == 0


def shrinking(history: list[Message]) -> list[list[str]]:
    """What each `elide_oldest` step leaves of `history` (after the request's first prompt)."""
    steps = [request().model_copy(update={"messages": [*request().messages, *history]})]
    while (shorter := elide_oldest(steps[-1])) is not None:
        steps.append(shorter)
    return [[m.content for m in r.messages[2:]] for r in steps]


def test_the_latest_exchange_is_kept_whole_longest_and_earlier_ones_go_whole():
    """Earlier results first, then earlier exchanges whole (the model's reply with its results),
    the latest exchange's results last; native calls (`tool` messages) as the text protocols."""
    text = [
        Message(role="assistant", content="call 1"),
        Message(role="user", content="Result of call 1"),
        Message(role="assistant", content="call 2"),
        Message(role="user", content="Result of call 2"),
    ]
    assert shrinking(text) == [
        ["call 1", "Result of call 1", "call 2", "Result of call 2"],
        ["call 1", ELIDED, "call 2", "Result of call 2"],
        ["call 2", "Result of call 2"],
        ["call 2", ELIDED],
    ]
    call = [{"id": "c1", "type": "function", "function": {"name": "search_text", "arguments": "{}"}}]
    native = [
        Message(role="assistant", content="one", tool_calls=call),
        Message(role="tool", tool_call_id="c1", content="tool 1"),
        Message(role="assistant", content="two", tool_calls=call),
        Message(role="tool", tool_call_id="c1", content="tool 2a"),
        Message(role="tool", tool_call_id="c1", content="tool 2b"),
    ]
    assert shrinking(native)[1:] == [
        ["one", ELIDED, "two", "tool 2a", "tool 2b"],
        ["two", "tool 2a", "tool 2b"],
        ["two", ELIDED, "tool 2b"],
        ["two", ELIDED, ELIDED],
    ]


def test_a_turn_whose_own_replies_outgrow_the_window_leaves_its_earlier_exchange_out():
    """A search (86 words) and an answer cut off (104 words) with the first prompt do not fit 300:
    the first exchange goes whole and the retry is sent with the refusal's reason, where leaving
    out tool results alone could not make it fit (the turn ended FAILED, never sent)."""
    long_search = json.dumps({"tool": "search_text", "arguments": {"text": "x1 " + "pad " * 80}})
    cut_off = '{"edits": [{"path": "calc.py", "search": "' + "word " * 100
    meter = WordMeter(window=300)
    result, engine = run([long_search, cut_off, ANSWER], meter, StepBudget(max_tool_calls=1))
    assert result.status is TurnStatus.COMPLETED and len(engine.batches) == 3
    retry = engine.batches[-1][0]
    assert not any("x1 pad" in m.content for m in retry.messages)  # the first exchange, whole
    assert retry.messages[-1].content.startswith("Result of edit")  # why the answer was refused
    assert all(meter.count(r) + r.max_tokens <= meter.window for batch in engine.batches for r in batch)


def test_a_refused_final_answer_gets_one_call_outside_the_budget():
    no_edit = json.dumps({"edits": [], "rationale": "nothing"})
    result, engine = run([search(1), no_edit, ANSWER], WordMeter(window=10_000), StepBudget(max_tool_calls=1))
    assert len(engine.batches) == 3 and extract_patch(result.content)
    assert "error" in engine.batches[2][0].messages[-1].content  # the reason went with the retry
    once = run([search(1), no_edit, no_edit, ANSWER], WordMeter(window=10_000), StepBudget(max_tool_calls=1))
    assert len(once[1].batches) == 3 and not extract_patch(once[0].content)  # one retry only


def test_a_json_answer_searches_in_the_functions_the_task_points_at():
    narrowed = focus(TEXTS, "f150 adds the wrong number", ["tests/test_big.py::test_f150"], "")
    assert narrowed == {"pkg/big.py": ["def f150(x):", "    return x + 150"]}
    engine = ScriptedEngine(tool_replies={"a1": [ANSWER]})
    runner = ToolTurns(engine, lambda n, a: "", StepBudget(), protocol="json", files=TEXTS, focus=narrowed)
    runner([request()])
    answer = engine.batches[0][0].response_schema["anyOf"][-1]["properties"]["edits"]["items"]
    assert answer["properties"]["search"] == {"enum": ["def f150(x):", "    return x + 150"]}
    assert focus(TEXTS, "nothing named here", [], "") == {}


def test_a_turn_with_less_time_than_its_budget_answers_at_once():
    engine = ScriptedEngine(tool_replies={"a1": [search(1), ANSWER]})
    executed: list[str] = []
    runner = ToolTurns(
        engine,
        lambda n, a: executed.append(n) or "out",
        StepBudget(),
        protocol="json",
        files=FILES,
        deadline=time.time() + 100,  # less than a turn's budget (240 s) before the deadline
    )
    [result] = runner([request()])
    assert executed == [] and all("anyOf" not in b[0].response_schema for b in engine.batches)
    assert extract_patch(result.content)


def test_a_turn_with_no_time_for_another_call_keeps_its_reply():
    engine = ScriptedEngine(tool_replies={"a1": [search(1), ANSWER]})
    runner = ToolTurns(
        engine, lambda n, a: "out", StepBudget(), protocol="json", files=FILES, deadline=time.time() - 1
    )
    [result] = runner([request()])
    assert len(engine.batches) == 1 and result.status is TurnStatus.COMPLETED  # not a call refused late


def test_when_every_proposal_fails_the_first_reason_says_why_in_one_line():
    council = factories.council(Task(task_id="t", description="d", role=Role.DEV, num_agents=2))
    unsent = TurnResult.unfinished(
        request(), TurnStatus.FAILED, "request (5031 tokens) does not fit", CONTEXT_EXCEEDED
    )
    turns = [unsent.model_copy(update={"agent_id": a.agent_id}) for a in council.agents]
    decision = decide(council, turns, [])
    assert decision.status is DeliberationStatus.FAILED
    assert decision.reasons[0] == (
        "why: the request did not fit the engine's context window (2 of 2 turns): "
        "request (5031 tokens) does not fit"
    )
    assert decision.reasons[1].startswith("only 0/2 agents produced a proposal")
