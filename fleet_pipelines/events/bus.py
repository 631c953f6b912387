"""One asyncio session with NATS JetStream: ensure streams, publish with `Nats-Msg-Id`, read by sequence.

nats-py is asyncio; Dagster ops and sensors are synchronous, so callers open a session inside a
short event loop (`NatsResource.session`) and close it before returning.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from .models import EventEnvelope
from .planning import StreamMessage
from .streams import STREAMS, StreamSpec


class NatsError(ConnectionError):
    """NATS could not be reached, stopped answering, or refused a JetStream request."""


# What a lost or refusing server raises (nats.errors.Error covers JetStream API errors too).
_NATS_ERRORS = (OSError, nats.errors.Error)


class StreamChange(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class ConnectOptions:
    url: str
    token: str | None = None
    user: str | None = None
    password: str | None = None
    creds_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    connect_timeout_s: float = 2.0
    request_timeout_s: float = 5.0

    def tls_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca_file or self.tls_cert_file):
            return None
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        if self.tls_cert_file:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return context


async def _silent(_: Exception) -> None:
    """nats-py prints every connection error by default; failures reach callers as exceptions."""


async def connect(options: ConnectOptions) -> NatsSession:
    try:
        # One attempt per server: nats-py's connect retries forever with max_reconnect_attempts=0.
        connecting = nats.connect(
            servers=[options.url],
            token=options.token,
            user=options.user,
            password=options.password,
            user_credentials=options.creds_file,
            tls=options.tls_context(),
            connect_timeout=options.connect_timeout_s,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.1,
            error_cb=_silent,
        )
        client = await asyncio.wait_for(connecting, options.connect_timeout_s * 2)
    except _NATS_ERRORS as exc:
        raise NatsError(f"NATS unreachable at {options.url}: {exc!r}") from exc
    return NatsSession(client, client.jetstream(timeout=options.request_timeout_s))


class NatsSession:
    def __init__(self, client: Client, js: JetStreamContext):
        self.client = client
        self.js = js

    async def close(self) -> None:
        if not self.client.is_closed:
            await self.client.close()

    async def ensure_streams(self, specs: Sequence[StreamSpec] = STREAMS) -> dict[str, StreamChange]:
        """Creates missing streams and updates subjects/retention/duplicate window that differ.

        Never deletes a stream or its messages; other settings of an existing stream are kept.
        """
        try:
            return {spec.name: await self._ensure_stream(spec) for spec in specs}
        except _NATS_ERRORS as exc:
            raise NatsError(f"ensuring streams: {exc!r}") from exc

    async def _ensure_stream(self, spec: StreamSpec) -> StreamChange:
        try:
            info = await self.js.stream_info(spec.name)
        except NotFoundError:
            await self.js.add_stream(
                StreamConfig(
                    name=spec.name,
                    subjects=list(spec.subjects),
                    max_age=spec.max_age_s,
                    duplicate_window=spec.duplicate_window_s,
                    storage=StorageType.FILE,
                    retention=RetentionPolicy.LIMITS,
                )
            )
            return StreamChange.CREATED
        current = info.config
        if (
            set(current.subjects or []) == set(spec.subjects)
            and current.max_age == spec.max_age_s
            and current.duplicate_window == spec.duplicate_window_s
        ):
            return StreamChange.UNCHANGED
        await self.js.update_stream(
            current.evolve(
                subjects=list(spec.subjects), max_age=spec.max_age_s, duplicate_window=spec.duplicate_window_s
            )
        )
        return StreamChange.UPDATED

    async def last_seq(self, stream: str) -> int:
        try:
            return (await self.js.stream_info(stream)).state.last_seq
        except _NATS_ERRORS as exc:
            raise NatsError(f"stream info of {stream}: {exc!r}") from exc

    async def publish(self, subject: str, envelope: EventEnvelope) -> tuple[int, bool]:
        """Publishes and waits for the JetStream ack: (stream sequence, dropped as a duplicate)."""
        try:
            ack = await self.js.publish(
                subject,
                envelope.model_dump_json().encode(),
                headers={"Nats-Msg-Id": envelope.idempotency_key},
            )
        except _NATS_ERRORS as exc:
            raise NatsError(f"publishing to {subject}: {exc!r}") from exc
        return ack.seq, bool(ack.duplicate)

    async def read_after(
        self, stream: str, subject: str, after_seq: int, max_messages: int, deadline: float
    ) -> AsyncIterator[StreamMessage]:
        """Messages on `subject` with stream sequence > `after_seq`, in order, until the stream ends,
        `max_messages` are read or `time.monotonic()` passes `deadline`.

        Stateless (a direct get of the next message by sequence, no consumer): the caller's cursor
        is the only record of progress, so nothing is acknowledged on anyone's behalf.
        """
        next_seq, count = after_seq + 1, 0
        while count < max_messages and time.monotonic() < deadline:
            try:
                raw = await self.js.get_msg(stream, seq=next_seq, subject=subject, next=True)
            except NotFoundError:
                return
            except _NATS_ERRORS as exc:
                raise NatsError(f"reading {stream} after seq {next_seq - 1}: {exc!r}") from exc
            count += 1
            next_seq = raw.seq + 1
            yield StreamMessage(
                stream=stream,
                seq=raw.seq,
                subject=raw.subject,
                data=raw.data or b"",
                headers={k: str(v) for k, v in (raw.headers or {}).items()},
            )
