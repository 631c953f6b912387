"""How init plans streams beside other systems' streams, and how the sensor's cursor meets a stream."""

from __future__ import annotations

import dataclasses

import pytest

from fleet_pipelines.events.streams import (
    STREAMS,
    ExistingStream,
    StreamAction,
    StreamPosition,
    StreamSpec,
    plan_streams,
    subject_covers,
    subjects_overlap,
)
from fleet_pipelines.sensors.planning import Cursor, resume_point


@pytest.mark.parametrize(
    ("wide", "narrow", "covers"),
    [
        ("a.>", "a.b", True),
        ("a.>", "a.>", True),
        ("a.>", "a.*.c", True),
        ("a.>", "a", False),
        ("a.*", "a.b", True),
        ("a.*", "a.>", False),
        ("a.b", "a.*", False),
        ("a.b.c", "a.b.c", True),
        (">", "x.y", True),
    ],
)
def test_subject_covers(wide, narrow, covers):
    assert subject_covers(wide, narrow) is covers


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [("a.>", "a.b.c", True), ("a.*", "a.b.c", False), ("a.*.c", "a.b.*", True), ("a.b", "a.c", False)],
)
def test_subjects_overlap(a, b, overlap):
    assert subjects_overlap(a, b) is overlap and subjects_overlap(b, a) is overlap


def theirs(name: str, *subjects: str, max_age_s: float = 3_600.0) -> ExistingStream:
    return ExistingStream(
        name=name, subjects=subjects, owned=False, max_age_s=max_age_s, duplicate_window_s=120.0, replicas=1
    )


OLD_SYSTEM = [
    theirs("PLANNING_EVENTS", "planning.>"),
    theirs("ORCHESTRATOR_EVENTS", "orchestration.>"),
    theirs("CONTEXT_EVENTS", "context.>"),
    theirs("AGENT_RESULTS", "agent.results.>"),
    theirs("VLLM_STREAMING", "vllm.streaming.>"),
]


def by_name(plans):
    return {p.spec.name: p for p in plans}


def test_a_clean_server_gets_every_stream_created_with_the_configured_replicas():
    plans = plan_streams(STREAMS, [], replicas=3)
    assert {p.action for p in plans} == {StreamAction.CREATE}
    assert all("3 replica(s)" in p.detail for p in plans)


def test_the_old_systems_streams_are_used_as_they_are_and_ours_created_beside_them():
    plans = by_name(plan_streams(STREAMS, OLD_SYSTEM, replicas=1))
    for old in OLD_SYSTEM:
        assert plans[old.name].action is StreamAction.USE and plans[old.name].stream == old.name
        assert "not ours" in plans[old.name].detail
    assert plans["AGENT_RESPONSES"].action is StreamAction.CREATE
    assert plans["AGENT_REVIEWS"].action is StreamAction.CREATE
    assert plans["DELIBERATION_RESULTS"].action is StreamAction.CREATE


def test_a_wider_stream_of_theirs_is_used_and_a_partial_overlap_is_a_conflict():
    existing = [theirs("EVERYTHING_AGENT", "agent.>"), theirs("SOME_PLANNING", "planning.plan.*")]
    plans = by_name(plan_streams(STREAMS, existing, replicas=1))
    for name in ("AGENT_RESULTS", "AGENT_RESPONSES", "AGENT_REVIEWS"):
        assert plans[name].action is StreamAction.USE and plans[name].stream == "EVERYTHING_AGENT"
    assert plans["PLANNING_EVENTS"].action is StreamAction.CONFLICT
    assert "SOME_PLANNING" in plans["PLANNING_EVENTS"].detail


def test_their_stream_under_our_name_but_other_subjects_is_a_conflict_never_an_edit():
    plans = by_name(
        plan_streams(STREAMS, [theirs("AGENT_RESPONSES", "agent.response.completed")], replicas=1)
    )
    assert plans["AGENT_RESPONSES"].action is StreamAction.CONFLICT
    assert "not ours" in plans["AGENT_RESPONSES"].detail


def test_our_own_stream_is_updated_where_it_differs():
    spec = StreamSpec(name="X", subjects=("x.>",), max_age_s=60.0)
    ours = ExistingStream(
        name="X", subjects=("x.>",), owned=True, max_age_s=30.0, duplicate_window_s=600.0, replicas=1
    )
    [plan] = plan_streams([spec], [ours], replicas=1)
    assert plan.action is StreamAction.UPDATE and plan.detail == "max_age_s 30.0 -> 60.0"
    [same] = plan_streams([spec], [ours.model_copy(update={"max_age_s": 60.0})], replicas=1)
    assert same.action is StreamAction.UNCHANGED


POSITION = StreamPosition(
    stream="PLANNING_EVENTS", first_seq=1, last_seq=10, created="2026-11-26T00:00:00+00:00"
)


def test_the_cursor_resumes_where_it_stopped():
    assert resume_point(None, POSITION) == (0, None)
    assert resume_point(Cursor(seq=4, stream="PLANNING_EVENTS", created=POSITION.created), POSITION) == (
        4,
        None,
    )
    assert resume_point(Cursor(seq=4), POSITION) == (4, None)  # a bare-sequence cursor of an older version


@pytest.mark.parametrize(
    ("cursor", "warning"),
    [
        (Cursor(seq=4, stream="PLANNING_EVENTS", created="2026-11-25T00:00:00+00:00"), "was recreated"),
        (Cursor(seq=12), "past the end"),
        (Cursor(seq=4, stream="OTHER", created=POSITION.created), "the cursor was on OTHER"),
    ],
)
def test_a_reset_stream_is_re_read_from_its_start_with_a_warning(cursor, warning):
    after, message = resume_point(cursor, POSITION)
    assert after == 0 and warning in message


def test_expired_messages_are_named():
    later = dataclasses.replace(POSITION, first_seq=8)
    after, message = resume_point(Cursor(seq=4, stream="PLANNING_EVENTS", created=POSITION.created), later)
    assert after == 4 and "seq 5..7" in message and "expired" in message


def test_the_cursor_round_trips():
    cursor = Cursor(seq=5, stream="S", created="c")
    assert Cursor.parse(cursor.dump()) == cursor
    assert Cursor.parse(None) is None and Cursor.parse("7") == Cursor(seq=7)
