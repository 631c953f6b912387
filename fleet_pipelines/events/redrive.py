"""Dead letters of the planning sensor: send them, list them, and re-drive one once fixed.

A re-driven message goes back to `planning.plan.approved` as a new stream message, so the sensor
reads it like any other; its `Nats-Msg-Id` is derived from the rejected sequence and the body, so
re-driving the same fix twice stores it once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import TYPE_CHECKING

from .models import PlanningRejected
from .outbound import rejected_event
from .planning import StreamMessage, minimal_rejection, plan_deliberations, rejection
from .streams import PLAN_APPROVED, PLANNING_REJECTED, PLANNING_STREAM, NatsError

if TYPE_CHECKING:
    from .bus import NatsSession

SCAN_LIMIT = 100_000


async def publish_dead_letter(session: NatsSession, message: StreamMessage, reason: str) -> None:
    """The bounded dead letter; when the server refuses it (or it exceeds max_payload), a minimal
    one with the reason, size and sha256 only. Raises NatsError when even that cannot be sent."""
    subject, event = rejected_event(rejection(message, reason))
    if session.fits(subject, event):
        try:
            await session.publish(subject, event)
            return
        except NatsError:
            if not session.client.is_connected:
                raise
    await session.publish(*rejected_event(minimal_rejection(message, reason)))


async def dead_letters(session: NatsSession, limit: int = SCAN_LIMIT) -> list[PlanningRejected]:
    """Every `orchestration.planning.rejected` payload still in the stream, oldest first."""
    stream = await session.stream_for(PLANNING_REJECTED)
    found = []
    async for message in session.read_after(stream, PLANNING_REJECTED, 0, limit, time.monotonic() + 30):
        found.append(PlanningRejected.model_validate(json.loads(message.data)["payload"]))
    return found


def original_bytes(rejected: PlanningRejected) -> bytes:
    """The original body; ValueError when the dead letter kept only part of it."""
    if rejected.original_truncated:
        raise ValueError(
            f"the dead letter keeps only part of the original ({rejected.original_size} bytes, "
            f"sha256 {rejected.original_sha256}); re-drive it with a corrected file"
        )
    if rejected.original_text is not None:
        return rejected.original_text.encode()
    return base64.b64decode(rejected.original_base64 or "")


def redrive_msg_id(stream_sequence: int, body: bytes) -> str:
    return f"redrive:{stream_sequence}:{hashlib.sha256(body).hexdigest()[:16]}"


async def redrive(session: NatsSession, stream_sequence: int, body: bytes | None) -> int:
    """Republishes the rejected message at `stream_sequence` (or `body`, its corrected version).

    Raises LookupError when no dead letter has that sequence, ValueError when the dead letter kept
    only part of the original (pass `body`), and planning.InvalidEvent when the message would be
    rejected again, so nothing is republished only to fail the same way.
    Returns the new stream sequence.
    """
    matches = [d for d in await dead_letters(session) if d.stream_sequence == stream_sequence]
    if not matches:
        raise LookupError(f"no rejected {PLANNING_STREAM} message with sequence {stream_sequence}")
    data = body if body is not None else original_bytes(matches[-1])
    plan_deliberations(StreamMessage(stream=PLANNING_STREAM, seq=0, subject=PLAN_APPROVED, data=data))
    ack = await session.js.publish(
        PLAN_APPROVED, data, headers={"Nats-Msg-Id": redrive_msg_id(stream_sequence, data)}
    )
    return ack.seq
