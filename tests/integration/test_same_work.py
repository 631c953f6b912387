"""The load benchmark's yardstick (benchmarks/same_work.py) on the real llama.cpp server: a replayed
request decodes as many tokens as the product's reply did, whatever the model samples this time."""

from __future__ import annotations

import sys

import pytest

from fleet_pipelines.cli import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from same_work import Call, replay

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
