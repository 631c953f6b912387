"""A story's context: the plan's story fields, context events on the CONTEXT stream and the
decisions of the story's earlier deliberations reach the prompts, bounded, with their sources."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from fleet_pipelines.assets.story import STORY_DECISIONS, story_decisions
from fleet_pipelines.domain.context import ContextEntry, assemble
from fleet_pipelines.domain.models import TurnKind
from fleet_pipelines.events.context import context_entry, context_subject
from fleet_pipelines.events.models import EventEnvelope
from fleet_pipelines.events.planning import StreamMessage, plan_deliberations
from fleet_pipelines.events.streams import PLAN_APPROVED, PLANNING_STREAM
from fleet_pipelines.resources.events import NatsResource
from tests.jobs import deliberation_defs, deliberation_resources, run_deliberation
from tests.scripted import ScriptedTurnRunner, recorded

ADD = "def add(a, b):\n    return a + b"


def entry(kind, source, text):
    return ContextEntry(kind=kind, source=source, text=text)


def test_the_context_keeps_the_story_then_the_newest_decisions_and_updates_within_its_bound():
    story = entry("story", "plan P", "Title: checkout")
    decisions = [entry("decision", f"decision of t{i}", "d" * 300) for i in range(5)]
    updates = [entry("update", f"CONTEXT_EVENTS #{i}", "u" * 300) for i in range(5)]
    built = assemble("S", story, decisions, updates, max_chars=1_500)
    kinds = [e.kind for e in built.entries]
    assert kinds[0] == "story" and set(kinds) == {"story", "decision"}
    assert [e.source for e in built.entries if e.kind == "decision"] == [
        "decision of t1",
        "decision of t2",
        "decision of t3",
        "decision of t4",
    ]  # newest kept, shown oldest first
    assert "decision of t0" in built.dropped and "CONTEXT_EVENTS #4" in built.dropped
    assert sum(len(e.text) for e in built.entries) <= 1_500
    long = assemble("S", None, [], [entry("update", "x", "y" * 5_000)])
    assert long.entries[0].text.endswith("…[truncated]") and len(long.entries[0].text) <= 1_200
    assert assemble(None, None, [], []).render() == ""


def test_context_events_parse_flat_or_enveloped_and_belong_to_their_story():
    flat = context_entry(
        "CONTEXT_EVENTS", 3, b'{"story_id": "S1", "content": "uses Postgres", "source": "ctx"}', "S1"
    )
    assert (flat.kind, flat.source, flat.text) == ("update", "CONTEXT_EVENTS #3 from ctx", "uses Postgres")
    enveloped = json.dumps({"event_type": "context.updated", "payload": {"story_id": "S1", "summary": "s"}})
    assert context_entry("C", 4, enveloped.encode(), "S1").text == "s"
    for bad in (b"not json", b'{"story_id": "S2", "summary": "x"}', b'{"story_id": "S1"}'):
        try:
            context_entry("C", 5, bad, "S1")
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")
    assert context_subject("US-42") == "context.updated.US-42"
    assert context_subject("a.b") is None and context_subject("a b") is None


def test_a_plans_story_fields_travel_to_every_task_and_not_from_a_task():
    body = {
        "story_id": "US-7",
        "plan_id": "P-7",
        "approved_by": "po",
        "timestamp": "2026-01-01T00:00:00Z",
        "roles": ["DEV", "QA"],
        "story_title": "Refunds",
        "story_description": "Customers get refunds.",
        "acceptance_criteria": ["refund within 5 days"],
    }
    message = StreamMessage(
        stream=PLANNING_STREAM, seq=1, subject=PLAN_APPROVED, data=json.dumps(body).encode()
    )
    for planned in plan_deliberations(message):
        assert planned.task_config["story_title"] == "Refunds"
        assert planned.task_config["acceptance_criteria"] == ["refund within 5 days"]
    with_task_story = {**body, "tasks": [{"description": "x", "role": "DEV", "story_title": "mine"}]}
    message = message.model_copy(update={"data": json.dumps(with_task_story).encode()})
    try:
        plan_deliberations(message)
    except ValueError as exc:
        assert "story_title" in str(exc)
    else:
        raise AssertionError("a task gave its own story title")


def run(instance, tmp_path: Path, nats_url: str, task_id: str, fields: dict, log: Path):
    runner = ScriptedTurnRunner(code=ADD, record_to=str(log))
    defs = deliberation_defs(
        deliberation_resources(tmp_path / "storage", NatsResource(url=nats_url), runner), [story_decisions]
    )
    result = run_deliberation(defs, instance, task_id, fields)
    assert result.success
    return result, defs


def test_a_story_of_two_tasks_the_second_sees_the_first_decision_story_fields_and_context_events(
    tmp_path: Path, nats_server: str
):
    story = f"US-{tmp_path.name[-12:].replace('_', '-')}"
    NatsResource(url=nats_server).publish(
        [
            (
                context_subject(story),
                EventEnvelope(
                    event_type="context.updated",
                    idempotency_key=f"ctx-{story}",
                    correlation_id=story,
                    payload={
                        "story_id": story,
                        "summary": "Amounts are integers in cents.",
                        "source": "ctx-svc",
                    },
                ),
            )
        ]
    )
    common = {
        "role": "DEV",
        "num_agents": 2,
        "rounds": 0,
        "story_id": story,
        "plan_id": "P-1",
        "story_title": "Money arithmetic",
        "acceptance_criteria": ["never loses a cent"],
    }
    with dg.DagsterInstance.ephemeral() as instance:
        first_log, second_log = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
        first, _ = run(
            instance, tmp_path, nats_server, "t1", {**common, "description": "Write add."}, first_log
        )
        winner = first.output_for_node("decision").winner_id
        second, defs = run(
            instance, tmp_path, nats_server, "t2", {**common, "description": "Write sub."}, second_log
        )

        first_prompt = recorded(first_log)[0].messages[-1].content
        assert "Title: Money arithmetic" in first_prompt and "- never loses a cent" in first_prompt
        assert "Amounts are integers in cents." in first_prompt
        assert "Decisions already taken" not in first_prompt  # nothing decided before t1
        proposals = [r for r in recorded(second_log) if r.kind is TurnKind.PROPOSE]
        assert len(proposals) == 2
        for request in proposals:
            if request.kind is TurnKind.PROPOSE:
                prompt = request.messages[-1].content
                assert "Decisions already taken for this story" in prompt
                assert f"(decision of t1 (run {first.run_id[:8]})) COMPLETED, winner {winner}" in prompt
                assert "Amounts are integers in cents." in prompt

        [context_meta] = second.asset_materializations_for_node("story_context")
        sources = [r.data["source"] for r in context_meta.metadata["sources"].value.records]
        assert sources[0] == "plan P-1" and f"decision of t1 (run {first.run_id[:8]})" in sources
        assert any(s.startswith("CONTEXT_EVENTS #") and s.endswith("from ctx-svc") for s in sources)
        assert context_meta.metadata["prior_decisions"].value == 1
        # The dependency is in the asset graph, and the decisions are story_decisions' materializations.
        graph = defs.resolve_asset_graph()
        assert STORY_DECISIONS in graph.get(dg.AssetKey("story_context")).parent_keys
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(STORY_DECISIONS, asset_partitions=[story]), limit=10
        ).records
        assert sorted(r.asset_materialization.metadata["task_id"].value for r in records) == ["t1", "t2"]


def test_story_context_reads_the_newest_context_events_of_a_long_story(tmp_path: Path, nats_resource):
    """A story with more events than the bound: the newest ones reach the context, oldest first,
    and another story's events on the same stream are not counted (a real nats-server, its streams
    deleted first: the consumers counted at the end are this test's alone)."""

    from fleet_pipelines.events.context import MAX_CONTEXT_MESSAGES, read_context_updates

    story, other = f"US-long-{tmp_path.name[-10:]}", f"US-other-{tmp_path.name[-10:]}"
    count = MAX_CONTEXT_MESSAGES + 60

    def event(story_id: str, i: int) -> tuple[str, EventEnvelope]:
        return context_subject(story_id), EventEnvelope(
            event_type="context.updated",
            idempotency_key=f"ctx-{story_id}-{i}",
            correlation_id=story_id,
            payload={"story_id": story_id, "summary": f"fact {i}"},
        )

    nats = nats_resource
    nats.publish([e for i in range(count) for e in (event(story, i), event(other, i))])
    entries, skipped = nats.session(lambda session: read_context_updates(session, story))
    texts = [e.text for e in entries]
    assert skipped == 0 and len(texts) == MAX_CONTEXT_MESSAGES
    assert texts[0] == f"fact {count - MAX_CONTEXT_MESSAGES}" and texts[-1] == f"fact {count - 1}"

    async def consumers(session) -> int:  # the counting consumer is gone after the read
        stream = await session.stream_for(context_subject(story))
        return (await session.js.stream_info(stream)).state.consumer_count

    assert nats.session(consumers) == 0
