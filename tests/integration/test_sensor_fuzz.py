"""10,000 generated messages through the planning sensor's drain on a real nats-server, ten per
tick: deep nesting, huge numbers, invalid UTF-8, lone surrogates, control characters, oversized
fields, odd message ids. None lets an exception out; each is planned or dead-lettered, and the
cursor always moves past it."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_pipelines import stack
from fleet_pipelines.events.bus import connect
from fleet_pipelines.events.planning import MAX_MESSAGE_BYTES
from fleet_pipelines.events.streams import PLAN_APPROVED
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.sensors.planning import Cursor, drain, run_requests
from tests.unit.test_planning_fuzz import enveloped, legacy, raw_bodies

EXAMPLES = 10_000
BATCH = 10  # messages per tick

deep = st.builds(
    lambda opener, n: opener * n,
    st.sampled_from([b"[", b'{"a":', b'{"payload":{"tasks":[', b'{"story_id":[']),
    st.integers(1, 45_000),  # the longest opener x 45,000 stays under the 1 MiB max_payload
)
huge_numbers = st.builds(  # a repeated key: the last one wins
    lambda digits, where: (json.dumps(legacy())[:-1] + f', "{where}": {digits}}}').encode(),
    st.sampled_from(["1" * 5_000, "9" * 4_301, "1e999999", "-" + "7" * 10_000, "1" * 4_300]),
    st.sampled_from(["num_agents", "story_id", "roles", "approved_at"]),
)
oversized = st.one_of(
    st.builds(
        lambda field, size, char: json.dumps({**legacy(), field: char * size}).encode(),
        st.sampled_from(["story_id", "plan_id", "approved_by", "approved_at", "extra"]),
        st.sampled_from([257, 10_000, 40_000, 150_000]),
        st.sampled_from(["x", "é", "\x00", "\x01"]),  # each non-ASCII one is a 6-byte escape
    ),
    st.just(json.dumps({**legacy(), "extra": "x" * MAX_MESSAGE_BYTES}).encode()),
)
escapes = st.builds(
    lambda field, text: json.dumps(enveloped({**legacy(), field: text})).encode().replace(b"SLASH", b"\\"),
    st.sampled_from(["story_id", "plan_id"]),
    st.sampled_from(["SLASHud800", "SLASHudfff", "SLASHud83dSLASHude00", "SLASHu0000", "a\nb", "\u202e"]),
)
invalid_utf8 = st.builds(
    lambda prefix, junk: prefix + junk,
    st.sampled_from([b"", b'{"story_id": "']),
    st.binary(min_size=1, max_size=64),
)
bodies = st.one_of(raw_bodies, deep, huge_numbers, oversized, escapes, invalid_utf8)
msg_ids = st.one_of(
    st.none(), st.text(min_size=1, max_size=40).filter(lambda t: "\r" not in t and "\n" not in t)
)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory):
    """A connection to a nats-server of this module's own, its streams created."""
    from fleet_pipelines.resources.events import NatsResource

    where = tmp_path_factory.mktemp("fuzz-nats")
    port = stack.free_port()
    server = stack.start_nats(where / "logs", port, where / "store")
    loop = asyncio.new_event_loop()
    opened = loop.run_until_complete(connect(NatsResource(url=f"nats://127.0.0.1:{port}").options()))
    loop.run_until_complete(opened.ensure_streams())
    yield loop, opened
    loop.run_until_complete(opened.close())
    loop.close()
    server.stop()


@pytest.mark.heavy(30)
def test_no_generated_message_lets_an_exception_out_of_the_sensor(session):
    loop, opened = session
    state = {"cursor": None, "count": 0}
    council = CouncilResource()  # the resource the sensor is given, the same at every tick

    async def tick(batch: list[tuple[bytes, str | None]]) -> None:
        pending = []
        for data, msg_id in batch:
            # Odd ids, made unique (a repeated one is dropped by JetStream before the sensor sees it).
            unique = f"{msg_id}#{state['count']}".encode("utf-8", "surrogatepass").decode("utf-8", "replace")
            # Published in order on one connection, their acks awaited together (one round trip).
            pending.append(
                await opened.js.publish_async(
                    PLAN_APPROVED, data, headers={"Nats-Msg-Id": unique} if msg_id else None
                )
            )
            state["count"] += 1
        acks = await asyncio.gather(*pending)
        assert not any(ack.duplicate for ack in acks)
        seqs = [ack.seq for ack in acks]
        drained = await drain(opened, state["cursor"], len(batch), 30.0)
        assert drained.error is None and drained.warning is None
        assert drained.cursor.seq == seqs[-1]
        # Each message is planned or dead-lettered, with a reason: never both, never neither.
        rejected = [seq for seq, _ in drained.rejected]
        planned = sorted({p.stream_seq for p in drained.planned})
        assert sorted(rejected + planned) == seqs
        assert all(reason.strip() for _, reason in drained.rejected)
        run_requests(drained.planned, council)  # what the sensor hands to Dagster builds for every plan
        state["cursor"] = drained.cursor

    @settings(
        max_examples=EXAMPLES // BATCH, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    @given(st.lists(st.tuples(bodies, msg_ids), min_size=BATCH, max_size=BATCH))
    def fuzz(batch: list[tuple[bytes, str | None]]) -> None:
        loop.run_until_complete(tick(batch))

    fuzz()
    assert state["count"] >= EXAMPLES
    assert isinstance(state["cursor"], Cursor)
