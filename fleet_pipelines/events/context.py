"""`context.updated.{story_id}` events on the CONTEXT stream -> entries of the story's context.

A context service (the old system's, or anyone's) publishes what it knows of a story on
`context.updated.{story_id}`, flat or enveloped: `{story_id, summary}` (`content` or `text` are
accepted for `summary`) and an optional `source`. Reading is stateless and bounded; a message that
does not parse is skipped and counted, never fatal to the deliberation.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from ..domain.context import ContextEntry
from .streams import CONTEXT_UPDATED

if TYPE_CHECKING:
    from .bus import NatsSession

MAX_CONTEXT_MESSAGES = 200  # of one story: its newest, oldest first (the stream keeps 7 days)
READ_TIMEOUT_S = 10.0
_TOKEN = re.compile(r"^[A-Za-z0-9_:-]{1,200}$")  # a NATS subject token of ours: no dots, no wildcards


class ContextUpdated(BaseModel):
    """A piece of a story's context."""

    model_config = ConfigDict(extra="ignore")

    story_id: str = Field(min_length=1, max_length=256)
    summary: str = Field(min_length=1, validation_alias=AliasChoices("summary", "content", "text"))
    source: str | None = Field(default=None, max_length=256)


def context_subject(story_id: str) -> str | None:
    """The subject a story's context events arrive on; None for a story id that is no subject token."""
    return f"{CONTEXT_UPDATED}.{story_id}" if _TOKEN.match(story_id) else None


def context_entry(stream: str, seq: int, data: bytes, story_id: str) -> ContextEntry:
    """The entry of one message; raises ValueError when it is not a context event of this story."""
    body = json.loads(data)
    if isinstance(body, dict) and "payload" in body and "event_type" in body:
        body = body["payload"]
    try:
        event = ContextUpdated.model_validate(body)
    except ValidationError as exc:
        raise ValueError(str(exc).splitlines()[0]) from exc
    if event.story_id != story_id:
        raise ValueError(f"story_id {event.story_id!r} on the subject of {story_id!r}")
    source = f"{stream} #{seq}" + (f" from {event.source}" if event.source else "")
    return ContextEntry(kind="update", source=source, text=event.summary)


async def read_context_updates(session: NatsSession, story_id: str) -> tuple[list[ContextEntry], int]:
    """The story's newest MAX_CONTEXT_MESSAGES context events, oldest first, and how many messages
    were skipped as unreadable."""
    subject = context_subject(story_id)
    if subject is None:
        return [], 0
    stream = await session.stream_for(subject)
    entries, skipped = [], 0
    deadline = time.monotonic() + READ_TIMEOUT_S
    after = await session.start_of_newest(stream, subject, MAX_CONTEXT_MESSAGES, deadline)
    async for message in session.read_after(stream, subject, after, MAX_CONTEXT_MESSAGES, deadline):
        try:
            entries.append(context_entry(stream, message.seq, message.data, story_id))
        except (ValueError, RecursionError):
            skipped += 1
    return entries, skipped
