"""The load benchmark's yardstick (benchmarks/same_work.py) on the real llama.cpp server: a replayed
request decodes as many tokens as the product's reply did, whatever the model samples this time."""

from __future__ import annotations

import json
import sys
import urllib.request

import pytest

from fleet_pipelines.cli import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from same_work import Call, Recorder, replay

BODY = {  # the model answers it in a few tokens
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 64,
    "temperature": 0.7,
    "stream": True,
    "stream_options": {"include_usage": True},
}


@pytest.mark.parametrize("recorded", [3, 40])
def test_a_free_text_request_decodes_exactly_the_products_tokens(llm_server: str, recorded: int):
    """Past the model's own end of text (40) and short of it (3)."""
    call = Call(
        body={**BODY, "stop": ["\n"]},
        sent=0.0,
        ended=1.0,
        tokens_out=recorded,
    )
    replayed, _ = replay(llm_server, [call], slots=1)
    assert replayed[0].tokens_out == recorded, replayed[0]


def test_a_request_under_a_json_schema_keeps_it_within_the_products_count(llm_server: str):
    """Its grammar must end where the schema does, so it decodes at most the product's tokens, and
    the engine still answers under the schema."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    call = Call(
        body={
            **BODY,
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
        },
        sent=0.0,
        ended=1.0,
        tokens_out=30,
    )
    replayed, _ = replay(llm_server, [call], slots=1)
    assert 0 < replayed[0].tokens_out <= 30
    assert replayed[0].text.lstrip().startswith("{")


def test_the_recorder_seeds_each_request_so_the_same_request_gets_the_same_reply(llm_server: str):
    """Sampled at temperature 1, the same request through the pass-through gets the same reply each
    time (its seed comes from its content); a request that names a seed keeps it."""
    recorder = Recorder(llm_server)
    url = recorder.start()
    body = {**BODY, "messages": [{"role": "user", "content": "Write a poem about the sea."}]}
    try:
        for sent in (body, body, {**body, "seed": 11}):
            request = urllib.request.Request(
                f"{url}/chat/completions",
                data=json.dumps({**sent, "temperature": 1.0, "max_tokens": 24}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                response.read()
    finally:
        recorder.stop()
    first, second, named = recorder.calls
    assert first.body["seed"] == second.body["seed"] and named.body["seed"] == 11
    assert first.tokens_out > 0 and first.text == second.text
