"""Whether an approved plan in the planning stream names a task (`fleet result` of a task no run
knows yet)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .planning import InvalidEvent, plan_deliberations
from .streams import PLAN_APPROVED

if TYPE_CHECKING:
    from .bus import NatsSession

STREAM_SCAN_WINDOW = 1_000


async def find_task_in_stream(session: NatsSession, task_id: str) -> int | None:
    """The sequence of the latest approved plan naming `task_id` among the last few in the stream."""
    stream = await session.stream_for(PLAN_APPROVED)
    after = max(0, await session.last_seq(stream) - STREAM_SCAN_WINDOW)
    found = None
    async for message in session.read_after(
        stream, PLAN_APPROVED, after, STREAM_SCAN_WINDOW, time.monotonic() + 3
    ):
        try:
            if any(p.task_id == task_id for p in plan_deliberations(message)):
                found = message.seq
        except InvalidEvent:
            continue
    return found
