"""The NATS JetStream resource: where the server is, how to log in, and a sync facade for ops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import dagster as dg
from pydantic import Field

from ..settings import NO_NATS

if TYPE_CHECKING:  # nats-py is imported when a session opens, not when the code location loads
    from ..events.bus import ConnectOptions, NatsSession
    from ..events.models import Publishable
    from ..events.streams import StreamPlan

T = TypeVar("T")


class NatsResource(dg.ConfigurableResource):
    """NATS with JetStream: the embedded `nats-server` of `make dev`, or any server via NATS_URL."""

    url: str | None = Field(
        default=None,
        description="Server URL, e.g. nats://127.0.0.1:4223 (NATS_URL, else the running local stack's); "
        "none: every connection fails saying so, never a guessed server.",
    )
    token: str | None = Field(default=None, description="Auth token; pass dg.EnvVar('NATS_TOKEN').")
    user: str | None = Field(default=None, description="User name; pass dg.EnvVar('NATS_USER').")
    password: str | None = Field(default=None, description="Password; pass dg.EnvVar('NATS_PASSWORD').")
    creds_file: str | None = Field(default=None, description="NATS .creds file (JWT + nkey seed) path.")
    tls_ca_file: str | None = Field(default=None, description="CA bundle that signs the server certificate.")
    tls_cert_file: str | None = Field(default=None, description="Client certificate for mutual TLS.")
    tls_key_file: str | None = Field(default=None, description="Key of the client certificate.")
    connect_timeout_s: float = Field(default=2.0, description="Seconds to wait for the connection.")
    request_timeout_s: float = Field(default=5.0, description="Seconds to wait for a JetStream reply/ack.")
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of the streams this system creates (FLEET_NATS_REPLICAS).",
    )

    def options(self) -> ConnectOptions:
        """How to connect; raises events.bus.NatsError when no server was chosen."""
        from ..events.bus import ConnectOptions, NatsError

        if not self.url:
            raise NatsError(NO_NATS)

        return ConnectOptions(
            url=self.url,
            token=self.token,
            user=self.user,
            password=self.password,
            creds_file=self.creds_file,
            tls_ca_file=self.tls_ca_file,
            tls_cert_file=self.tls_cert_file,
            tls_key_file=self.tls_key_file,
            connect_timeout_s=self.connect_timeout_s,
            request_timeout_s=self.request_timeout_s,
        )

    def session(self, work: Callable[[NatsSession], Awaitable[T]], ensure_streams: bool = True) -> T:
        """Runs `work` in a short event loop on a fresh connection, the streams ensured first.

        Raises events.bus.NatsError when the server cannot be reached.
        """

        from ..events.bus import connect

        async def main() -> T:
            session = await connect(self.options())
            try:
                if ensure_streams:
                    await session.ensure_streams(replicas=self.stream_replicas)
                return await work(session)
            finally:
                await session.close()

        return asyncio.run(main())

    @contextmanager
    def publisher(self) -> Iterator[NatsPublisher]:
        """One connection held open for a step (streams ensured), for events published one at a
        time as turns stream and finish; a fresh connection per message would cost ~5 ms each."""
        from ..events.bus import connect

        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="nats-publisher", daemon=True)
        thread.start()

        async def open_session() -> NatsSession:
            session = await connect(self.options())
            try:
                await session.ensure_streams(replicas=self.stream_replicas)
            except BaseException:
                await session.close()
                raise
            return session

        try:
            session = asyncio.run_coroutine_threadsafe(open_session(), loop).result()
            try:
                yield NatsPublisher(loop, session, self.request_timeout_s)
            finally:
                asyncio.run_coroutine_threadsafe(session.close(), loop).result(self.request_timeout_s)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def ensure_streams(self, dry_run: bool = False) -> list[StreamPlan]:
        """Creates or updates this system's streams (or only plans it); what happens to each."""
        return self.session(
            lambda session: session.ensure_streams(replicas=self.stream_replicas, dry_run=dry_run),
            ensure_streams=False,
        )

    def publish(self, events: Sequence[tuple[str, Publishable]]) -> list[tuple[int, bool]]:
        """Publishes (subject, envelope) pairs in order, each acked by JetStream; duplicates of an
        idempotency key within the stream's window are dropped by the server (flag True)."""

        async def work(session: NatsSession) -> list[tuple[int, bool]]:
            return [await session.publish(subject, envelope) for subject, envelope in events]

        return self.session(work)


class NatsPublisher:
    """Publishes on an open session from synchronous code (the session's loop runs in a thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, session: NatsSession, timeout_s: float):
        self._loop = loop
        self._session = session
        self._timeout_s = timeout_s
        self.dropped = 0  # best-effort messages that were not stored

    def publish(self, events: Sequence[tuple[str, Publishable]]) -> list[tuple[int, bool]]:
        """Publishes in order and waits for each JetStream ack; raises NatsError."""

        async def work() -> list[tuple[int, bool]]:
            return [await self._session.publish(subject, envelope) for subject, envelope in events]

        return asyncio.run_coroutine_threadsafe(work(), self._loop).result(
            self._timeout_s * (len(events) + 1)
        )

    def publish_nowait(self, subject: str, envelope: Publishable) -> None:
        """Best effort, in order, without waiting (progress): a failure only counts in `dropped`."""

        def done(future: Future) -> None:
            if future.exception() is not None:
                self.dropped += 1

        future = asyncio.run_coroutine_threadsafe(self._session.publish(subject, envelope), self._loop)
        future.add_done_callback(done)
