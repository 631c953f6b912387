"""Property-based fuzz of planning payloads and envelopes (issue 7): every message either plans
valid deliberations or is rejected with a reason whose dead-letter event serialises; nothing else
ever escapes (an exception here would fail a sensor tick)."""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_pipelines.domain.models import TASK_ID_PATTERN, Role
from fleet_pipelines.events.outbound import rejected_event
from fleet_pipelines.events.planning import (
    DEAD_LETTER_REASON_CHARS,
    MAX_MESSAGE_BYTES,
    InvalidEvent,
    StreamMessage,
    plan_deliberations,
    rejection,
)
from tests import factories

ROLES = [r.value for r in Role]
hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(categories=["Cs", "Co", "Cc", "Zl", "Mn"]), max_size=20),
    st.sampled_from(["", " ", "\x00", "\ud800", "‮DEV", "D\u0301EV", "dev", "x" * 300, "💥" * 50]),
)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), hostile_text)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=12,
)


def legacy(plan: str = "P-1", roles: list | None = None) -> dict:
    return factories.plan(plan_id=plan, roles=roles or ["DEV"])


def enveloped(payload: dict) -> dict:
    return {
        "event_type": "planning.plan.approved",
        "idempotency_key": "k-1",
        "correlation_id": "c-1",
        "timestamp": "2026-11-25T10:00:00Z",
        "producer": "planning",
        "payload": payload,
    }


FIELDS = ["story_id", "plan_id", "approved_by", "roles", "tasks", "approved_at", "timestamp"]
mutated_payload = st.builds(
    lambda base, key, value, drop: {
        **{k: v for k, v in base.items() if k != drop},
        **({key: value} if key else {}),
    },
    st.sampled_from([legacy(), legacy(roles=ROLES)]),
    st.one_of(st.none(), st.sampled_from(FIELDS), hostile_text),
    json_value,
    st.one_of(st.none(), st.sampled_from(FIELDS)),
)
task_entry = st.fixed_dictionaries(
    {"description": hostile_text, "role": st.one_of(st.sampled_from(ROLES), hostile_text)},
    optional={
        "task_id": hostile_text,
        "num_agents": json_scalar,
        "rounds": json_scalar,
        "requirements": json_value,
        "metadata": json_value,
        "timeout_seconds": json_scalar,
    },
)
with_tasks = st.builds(lambda tasks: {**legacy(), "tasks": tasks}, st.lists(task_entry, max_size=4))
payloads = st.one_of(mutated_payload, with_tasks, json_value)


def encode(body: object) -> bytes:
    return json.dumps(body).encode()  # ensure_ascii: lone surrogates travel as \\ud800 escapes


raw_bodies = st.one_of(
    st.builds(encode, payloads),
    st.builds(lambda p: encode(enveloped(p)), payloads),
    st.builds(lambda b, cut: b[:cut], st.builds(encode, st.just(enveloped(legacy()))), st.integers(0, 200)),
    st.binary(max_size=300),
    st.just(b"{" + b" " * (MAX_MESSAGE_BYTES + 1) + b"}"),
)


def check(data: bytes, seq: int = 7) -> None:
    message = StreamMessage(stream="PLANNING_EVENTS", seq=seq, subject="planning.plan.approved", data=data)
    try:
        planned = plan_deliberations(message)
    except InvalidEvent as exc:
        reason = str(exc)
        assert reason.strip()
        subject, envelope = rejected_event(rejection(message, reason))
        assert subject == "orchestration.planning.rejected"
        payload = json.loads(envelope.model_dump_json())["payload"]
        assert payload["stream_sequence"] == seq and payload["reason"] == reason[:DEAD_LETTER_REASON_CHARS]
        return
    assert planned
    for p in planned:
        assert re.fullmatch(TASK_ID_PATTERN, p.task_id)
        assert p.role in ROLES and p.stream_seq == seq
        assert p.run_key.endswith(f":{p.task_id.replace(':', '%3A')}")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_bodies)
def test_any_message_plans_valid_work_or_is_rejected_with_a_reason(data: bytes):
    check(data)


def test_the_seed_samples_are_accepted():
    planned = plan_deliberations(
        StreamMessage(
            stream="S", seq=1, subject="planning.plan.approved", data=encode(legacy(roles=["DEV", "QA"]))
        )
    )
    assert [p.role for p in planned] == ["DEV", "QA"]
