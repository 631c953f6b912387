"""Event models and the planning parser: legacy and enveloped plans, derived ids, precise rejections."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re

import pytest

from fleet_pipelines.domain.decision import Decision, RankedProposal
from fleet_pipelines.domain.models import (
    TASK_ID_PATTERN,
    DeliberationStatus,
    Role,
    Task,
    TurnKind,
    TurnStatus,
    safe_partition_key,
)
from fleet_pipelines.events.bus import nats_msg_id
from fleet_pipelines.events.outbound import (
    agent_response_events,
    collector_event,
    decision_outcome,
    deliberation_outcome_event,
    outcome_key,
    rejected_event,
)
from fleet_pipelines.events.planning import (
    DEAD_LETTER_ORIGINAL_BYTES,
    DEAD_LETTER_REASON_CHARS,
    MAX_MESSAGE_BYTES,
    InvalidEvent,
    StreamMessage,
    derived_task_id,
    minimal_rejection,
    plan_deliberations,
    rejection,
    run_key,
    single_task_plan,
)
from fleet_pipelines.history.stored import stored_path
from tests.factories import turn

# The two sample messages of the old system's planning service, verbatim.
LEGACY = b'{"story_id": "US-42", "plan_id": "P-42", "approved_by": "po@example.com", "roles": ["DEV", "QA"], "approved_at": "2026-11-25T10:00:00Z"}'  # noqa: E501
ENVELOPED = b'{"event_type": "planning.plan.approved", "idempotency_key": "b7c1", "correlation_id": "c9", "timestamp": "2026-11-25T10:00:00Z", "producer": "planning-service", "metadata": {}, "payload": {"story_id": "US-43", "plan_id": "P-43", "approved_by": "po", "roles": ["ARCHITECT"], "timestamp": "2026-11-25T10:00:00Z"}}'  # noqa: E501


def message(data: bytes | dict, seq: int = 7, msg_id: str | None = None) -> StreamMessage:
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    headers = {"Nats-Msg-Id": msg_id} if msg_id else {}
    return StreamMessage(
        stream="PLANNING_EVENTS",
        seq=seq,
        subject="planning.plan.approved",
        data=body,
        headers=headers,
        msg_id=msg_id,
    )


def test_legacy_flat_plan_gives_one_task_per_role_with_the_seed_description():
    planned = plan_deliberations(message(LEGACY))
    assert [p.role for p in planned] == ["DEV", "QA"]
    assert {p.task_config["description"] for p in planned} == {"Implement plan P-42 for story US-42"}
    assert all(p.task_config["story_id"] == "US-42" and p.task_config["plan_id"] == "P-42" for p in planned)
    assert all(re.fullmatch(TASK_ID_PATTERN, p.task_id) for p in planned)
    # No envelope, no Nats-Msg-Id: the key is a hash of the body, the same for the same plan.
    again = plan_deliberations(message(LEGACY, seq=99))
    assert [p.run_key for p in again] == [p.run_key for p in planned]
    assert planned[0].run_tags()["fleet/role"] == "DEV"
    assert planned[0].run_tags()["fleet/planning_seq"] == "7"


def test_legacy_plan_uses_the_publishers_msg_id_when_present():
    planned = plan_deliberations(message(LEGACY, msg_id="planner-123"))
    assert planned[0].run_key == f"planner-123:{planned[0].task_id}"


def test_run_keys_are_unambiguous_when_keys_and_task_ids_hold_colons():
    # Before: `k:x` with task `y` and `k` with task `x:y` both gave `k:x:y`, and the second plan
    # was dropped as a duplicate.
    assert run_key("k:x", "y") != run_key("k", "x:y")
    assert run_key("k%3Ax", "y") != run_key("k:x", "y")
    assert run_key("b7c1", "t-1") == "b7c1:t-1"  # plain keys read as before


def test_poison_messages_of_the_issue_are_rejected_with_a_reason():
    deep = plan_deliberations_reason(b"[" * 50_000)
    assert "nested too deeply" in deep
    huge = plan_deliberations_reason(b"1" * 5_000)
    assert huge.startswith("not JSON") and "digits" in huge
    surrogate = plan_deliberations_reason(json.dumps({**json.loads(LEGACY), "story_id": "\ud800"}).encode())
    assert "lone UTF-16 surrogate" in surrogate
    control = plan_deliberations_reason(json.dumps({**json.loads(LEGACY), "plan_id": "P\u0000"}).encode())
    assert control.startswith("plan_id: control")


def plan_deliberations_reason(data: bytes) -> str:
    with pytest.raises(InvalidEvent) as caught:
        plan_deliberations(message(data))
    return str(caught.value)


def test_partition_keys_dot_and_dotdot_are_refused_in_one_place():
    for bad in (".", ".."):
        reason = plan_deliberations_reason(
            json.dumps(
                {**json.loads(LEGACY), "tasks": [{"task_id": bad, "description": "d", "role": "DEV"}]}
            ).encode()
        )
        assert "not a safe partition key" in reason
        with pytest.raises(ValueError, match="not a safe partition key"):
            stored_path("/tmp/storage", "decision", bad)  # where asset values are written
    assert safe_partition_key("a..b") == "a..b" and safe_partition_key(".hidden") == ".hidden"


def test_enveloped_plan_with_timestamp_uses_the_envelope_keys():
    [planned] = plan_deliberations(message(ENVELOPED))
    assert planned.role == "ARCHITECT"
    assert planned.correlation_id == "c9"
    assert planned.run_key == f"b7c1:{planned.task_id}"
    assert planned.task_id == derived_task_id("P-43", "ARCHITECT")


def test_explicit_tasks_give_one_deliberation_each_with_their_settings():
    envelope = single_task_plan(
        "t-1",
        {"description": "Write add(a, b)", "role": "QA", "num_agents": 2, "rounds": 0, "requirements": ["x"]},
        story_id="S",
        plan_id="P",
        approved_by="me",
        idempotency_key="k",
    )
    [planned] = plan_deliberations(message(envelope.model_dump_json().encode()))
    assert planned.task_id == "t-1"
    assert planned.task_config["num_agents"] == 2 and planned.task_config["rounds"] == 0
    assert planned.task_config["requirements"] == ["x"]
    assert planned.run_key == "k:t-1"


def test_a_planned_task_is_validated_once_as_the_task(monkeypatch):
    """Each task of a plan is validated once, by the domain Task (no second model of it), and the
    run's config is what the plan gave, in the flat form; a task naming a plan field is refused."""
    from fleet_pipelines.events import planning

    validated: list[str] = []
    from_fields = Task.from_fields

    def counted(task_id, fields):
        validated.append(task_id)
        return from_fields(task_id, fields)

    monkeypatch.setattr(planning.Task, "from_fields", counted)
    plan = {
        "story_id": "S",
        "plan_id": "P",
        "approved_by": "x",
        "timestamp": "t",
        "tasks": [
            {"task_id": "t-1", "description": "d", "role": "DEV", "timeout_seconds": 60},
            {"task_description": "e", "role": "QA", "constraints": {"rubric": "r", "requirements": ["q"]}},
        ],
    }
    first, second = plan_deliberations(message(plan))
    assert validated == [first.task_id, second.task_id] and first.task_id == "t-1"
    assert first.task_config == {
        "description": "d",
        "role": "DEV",
        "timeout_seconds": 60.0,
        "story_id": "S",
        "plan_id": "P",
    }
    assert second.task_config == {
        "description": "e",
        "role": "QA",
        "rubric": "r",
        "requirements": ["q"],
        "story_id": "S",
        "plan_id": "P",
    }
    plan["tasks"] = [
        {"description": "d", "role": "DEV", "context": {"story_id": "S"}}
    ]  # the run assembles it
    with pytest.raises(InvalidEvent, match=re.escape("tasks.0.context: Extra inputs are not permitted")):
        plan_deliberations(message(plan))
    plan["tasks"] = [{"description": "d", "role": "DEV", "story_title": "mine"}]
    with pytest.raises(
        InvalidEvent, match=re.escape("tasks.0.story_title: the plan's field, a task does not give its own")
    ):
        plan_deliberations(message(plan))


def test_derived_task_ids_are_stable_valid_and_distinct():
    odd = "P/42 é" * 40
    ids = {derived_task_id(odd, "DEV"), derived_task_id(odd, "QA"), derived_task_id(odd, "DEV", 1)}
    assert len(ids) == 3
    assert all(re.fullmatch(TASK_ID_PATTERN, i) for i in ids)
    assert derived_task_id(odd, "DEV") == derived_task_id(odd, "DEV")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (
            {"plan_id": "P", "approved_by": "x", "roles": ["DEV"], "approved_at": "t"},
            "story_id: Field required",
        ),
        ({"story_id": "S", "plan_id": "P", "approved_by": "x", "roles": ["DEV"]}, "approved_at or timestamp"),
        (
            {"story_id": "S", "plan_id": "P", "approved_by": "x", "roles": ["CHEF"], "timestamp": "t"},
            "roles.0",
        ),
        (
            {"story_id": "S", "plan_id": "P", "approved_by": "x", "roles": [], "timestamp": "t"},
            "at least one role",
        ),
        (
            {
                "story_id": "S",
                "plan_id": "P",
                "approved_by": "x",
                "timestamp": "t",
                "tasks": [{"description": "d", "role": "DEV", "num_agents": 11}],
            },
            "tasks.0.num_agents",
        ),
        (
            {
                "story_id": "S",
                "plan_id": "P",
                "approved_by": "x",
                "timestamp": "t",
                "tasks": [{"task_id": "bad id!", "description": "d", "role": "DEV"}],
            },
            "tasks.0.task_id: String should match pattern",
        ),
        (
            {
                "event_type": "planning.plan.approved",
                "idempotency_key": "k",
                "correlation_id": "c",
                "payload": {"story_id": "S", "plan_id": "P", "approved_by": "x", "roles": ["DEV"]},
                "schema_version": 9,
            },
            "invalid envelope: schema_version",
        ),
        (
            {
                "event_type": "planning.story.created",
                "idempotency_key": "k",
                "correlation_id": "c",
                "payload": {},
            },
            "event_type 'planning.story.created'",
        ),
        (b"{" + b" " * MAX_MESSAGE_BYTES + b"}", "over the"),
    ],
)
def test_malformed_plans_are_rejected_with_a_precise_reason(data, reason):
    with pytest.raises(InvalidEvent) as caught:
        plan_deliberations(message(data))
    assert reason in str(caught.value)


def test_rejection_keeps_the_original_bytes_as_text_or_base64():
    text = rejection(message(b'{"a": 1}', seq=3), "why")
    assert text.original_text == '{"a": 1}' and text.original_base64 is None and text.stream_sequence == 3
    assert text.original_size == 8 and not text.original_truncated
    binary = rejection(message(b"\xff\x00"), "why")
    assert binary.original_text is None and binary.original_base64 == "/wA="


def test_dead_letters_are_bounded_and_keep_size_and_hash():
    body = os.urandom(200_000)  # the issue's 200 kB binary body: its dead letter grew to 1.2 MB
    rejected = rejection(message(body), "x" * 100_000)
    _, event = rejected_event(rejected)
    assert len(event.encoded()) < 100_000
    assert rejected.original_truncated and rejected.original_size == 200_000
    assert rejected.original_sha256 == hashlib.sha256(body).hexdigest()
    assert base64.b64decode(rejected.original_base64) == body[:DEAD_LETTER_ORIGINAL_BYTES]
    assert len(rejected.reason) == DEAD_LETTER_REASON_CHARS
    # Text cut inside a multi-byte character keeps only whole characters.
    text = ("é" * DEAD_LETTER_ORIGINAL_BYTES).encode()
    cut = rejection(message(text), "why").original_text
    assert cut == "é" * (DEAD_LETTER_ORIGINAL_BYTES // 2)
    minimal = minimal_rejection(message(body), "y" * 10_000)
    assert minimal.original_text is None and minimal.original_base64 is None and minimal.original_truncated
    assert len(rejected_event(minimal)[1].encoded()) < 2_000
    # Two different messages at one sequence (a recreated stream) get two dead letters.
    assert rejected_event(rejection(message(b"a"), "r"))[1].idempotency_key != (
        rejected_event(rejection(message(b"b"), "r"))[1].idempotency_key
    )


def test_message_ids_are_bytes_safe():
    assert nats_msg_id("plan-42") == "plan-42"
    ids = {nats_msg_id(k) for k in ("plan-é", "plan-ü", "plan-\ud800", "plan-\udfff", "x" * 300, "a\nb")}
    assert len(ids) == 6 and all(i.isascii() and i.isprintable() for i in ids)


def _task() -> Task:
    return Task(
        task_id="t-1", description="d", role=Role.DEV, num_agents=2, rounds=0, story_id="S", plan_id="P"
    )


def test_agent_responses_follow_the_seed_payload_and_have_deterministic_keys():
    ok = turn(
        content="text",
        task_id="t-1",
        model="m",
        temperature=0.7,
        tokens_out=5,
        latency_ms=12.0,
    )
    failed = ok.model_copy(
        update={
            "agent_id": "agent-dev-002",
            "status": TurnStatus.TIMEOUT,
            "content": "",
            "error": "late",
            "error_type": "Deadline",
        }
    )
    events = agent_response_events(_task(), [ok, failed], "run-1", "corr", "cause")
    assert [subject for subject, _ in events] == [
        "agent.response.completed",
        "agent.results.t-1",
        "agent.response.failed",
        "agent.results.t-1",
    ]
    done, late = (e.payload for _, e in events[::2])
    assert done["proposal"] == {
        "content": "text",
        "author_id": "agent-dev-001",
        "author_role": "DEV",
        "model": "m",
        "temperature": 0.7,
        "tokens": 5,
    }
    assert done["round"] == 0 and done["num_agents"] == 2 and done["status"] == "completed"
    assert late["proposal"] is None and late["error_type"] == "Deadline" and late["status"] == "timeout"
    assert events[0][1].correlation_id == "corr" and events[0][1].causation_id == "cause"
    assert [e.idempotency_key for _, e in events] == [
        e.idempotency_key for _, e in agent_response_events(_task(), [ok, failed], "run-1")
    ]
    # agent.results.{task_id}: the old workers' payload, unenveloped, without our extra fields.
    worker = json.loads(events[1][1].encoded())
    # Without our round/kind/target/queue fields, and without fields that are None (no error here).
    absent = ("round", "kind", "target_agent_id", "queue_ms", "error", "error_type")
    assert worker == {k: v for k, v in done.items() if k not in absent}
    assert "proposal" not in json.loads(events[3][1].encoded())

    # Critiques and revisions go on subjects of their own: agent responses count proposals only.
    critique = ok.model_copy(
        update={"kind": TurnKind.CRITIQUE, "round": 1, "target_agent_id": "agent-dev-002"}
    )
    revise = ok.model_copy(update={"kind": TurnKind.REVISE, "round": 1, "status": TurnStatus.FAILED})
    assert [s for s, _ in agent_response_events(_task(), [critique, revise], "run-1")] == [
        "agent.critique.completed",
        "agent.revision.failed",
    ]

    # The old collector's deliberation.completed, then .failed when no agent answered.
    subject, event = collector_event(_task(), [ok, failed], "run-1", 1234.5)
    body = json.loads(event.encoded())
    assert subject == "deliberation.completed" and body["status"] == "completed"
    assert [r["agent_id"] for r in body["results"]] == ["agent-dev-001"]
    assert body["results"][0]["proposal"] == done["proposal"]
    assert [f["agent_id"] for f in body["failed_agents"]] == ["agent-dev-002"]
    assert (body["total_agents"], body["successful_responses"], body["failed_responses"]) == (2, 1, 1)
    assert body["duration_ms"] == 1234 and body["completed_at"]
    subject, event = collector_event(_task(), [failed], "run-1", 9.0)
    body = json.loads(event.encoded())
    assert subject == "deliberation.failed" and body["status"] == "failed"
    assert body["error"] == "All agents failed" and body["failed_agents"][0]["error"] == "late"


def test_outcome_subject_follows_the_status_and_the_key_is_one_per_run():
    decision = Decision(
        status=DeliberationStatus.PARTIAL,
        winner_id="agent-dev-001",
        ranking=[RankedProposal(rank=1, agent_id="agent-dev-001", score=0.8)],
        reasons=["agent-dev-001 ranked first"],
        quorum=2,
        usable_agents=2,
        failed_agents=[],
        timed_out_agents=[],
    )
    subject, envelope = deliberation_outcome_event(decision_outcome(_task(), decision, "run-1", 5.0))
    assert subject == "orchestration.deliberation.completed"
    assert envelope.idempotency_key == outcome_key("run-1")
    payload = envelope.payload
    assert payload["winner_id"] == "agent-dev-001" and payload["story_id"] == "S"
    assert payload["decisions"][0]["affected_subtask"] == "t-1"
    timeout = decision.model_copy(update={"status": DeliberationStatus.TIMEOUT, "winner_id": None})
    assert deliberation_outcome_event(decision_outcome(_task(), timeout, "r", 1.0))[0] == (
        "orchestration.deliberation.failed"
    )
