"""The NATS JetStream resource: where the server is, how to log in and how streams are created
(the fields of `events.options.ConnectOptions` and `StreamOptions`), a sync facade for ops, and
the outbox that keeps what cannot be published."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import dagster as dg
from pydantic import Field

from ..events.options import ConnectOptions, StreamOptions
from ..events.outbox import Event, Outbox
from ..events.streams import NatsError
from .config import derived_model

if TYPE_CHECKING:  # nats-py is imported when a session opens, not when the code location loads
    from ..events.bus import NatsSession
    from ..events.models import Publishable
    from ..events.streams import StreamPlan

T = TypeVar("T")

_NatsFields = derived_model(
    StreamOptions,
    "NatsStreamFields",
    derived_model(ConnectOptions, "NatsConnectFields", dg.ConfigurableResource),
)


@dataclass
class FlushReport:
    sent: int = 0  # events published (duplicates included)
    duplicates: int = 0  # of them, dropped by JetStream as copies of messages it had
    pending: int = 0  # still kept (NATS unreachable)
    error: str | None = None


class NatsResource(_NatsFields):
    """NATS with JetStream: the embedded `nats-server` of `make dev`, or any server via NATS_URL.
    Events a run cannot publish are kept in the outbox and sent when NATS is back."""

    outbox_path: str | None = Field(
        default=None,
        description="Where a run keeps the events it cannot publish until NATS is back (default "
        "<storage>/outbox). None: such a run fails.",
    )

    def options(self) -> ConnectOptions:
        return ConnectOptions(**{name: getattr(self, name) for name in ConnectOptions.model_fields})

    def outbox(self) -> Outbox | None:
        return Outbox(self.outbox_path) if self.outbox_path else None

    def session(self, work: Callable[[NatsSession], Awaitable[T]], ensure_streams: bool = True) -> T:
        """Runs `work` in a short event loop on a fresh connection, the streams ensured first.

        Raises events.streams.NatsError when the server cannot be reached.
        """
        from ..events.bus import run_session

        return run_session(self.options(), work, self.stream_replicas if ensure_streams else None)

    @contextmanager
    def publisher(self, run_id: str) -> Iterator[EventSink]:
        """One connection held open for a step (streams ensured), for events published one at a
        time as turns stream and finish; a fresh connection per message would cost ~5 ms each.
        Without NATS, or once it is lost, the run's events go to the outbox; with a connection,
        what the run kept earlier is sent first."""
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

        session = None
        try:
            try:
                session = asyncio.run_coroutine_threadsafe(open_session(), loop).result()
            except NatsError as exc:
                sink = EventSink(loop, None, self.request_timeout_s, self.outbox(), run_id, str(exc))
            else:
                sink = EventSink(loop, session, self.request_timeout_s, self.outbox(), run_id)
                sink.flush()
            try:
                yield sink
            finally:
                sink.close()
                if session is not None:  # a connection lost meanwhile must not fail the step
                    closing = asyncio.run_coroutine_threadsafe(session.close(), loop)
                    with contextlib.suppress(Exception):
                        closing.result(self.request_timeout_s)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def deliver(self, run_id: str, events: Sequence[Event]) -> EventSink:
        """Publishes the run's events (what it kept before first), or keeps them; the sink tells
        how many are pending."""
        with self.publisher(run_id) as sink:
            sink.publish(events)
        return sink

    def flush_outbox(self, run_ids: Sequence[str]) -> FlushReport:
        """Sends the kept events of these runs, oldest first; stops at the first failure."""
        report = FlushReport()
        outbox = self.outbox()
        if outbox is None or not run_ids:
            return report
        try:
            with self.publisher(run_ids[0]) as sink:  # sends the first run's kept events
                for run_id in run_ids[1:]:
                    sink.run_id = run_id
                    sink.flush()
                report.sent, report.duplicates, report.error = (
                    sink.resent,
                    sink.resent_duplicates,
                    sink.unreachable,
                )
        finally:
            report.pending = sum(outbox.pending(run_id) for run_id in run_ids)
        return report

    def ensure_streams(self, dry_run: bool = False) -> list[StreamPlan]:
        """Creates or updates this system's streams (or only plans it); what happens to each."""
        return self.session(
            lambda session: session.ensure_streams(replicas=self.stream_replicas, dry_run=dry_run),
            ensure_streams=False,
        )

    def publish(self, events: Sequence[tuple[str, Publishable]]) -> list[tuple[int, bool]]:
        """Publishes (subject, envelope) pairs in order, each acked by JetStream; duplicates of an
        idempotency key within the stream's window are dropped by the server (flag True). Raises
        NatsError: for callers that report the failure themselves (the CLI, the planning reader)."""

        async def work(session: NatsSession) -> list[tuple[int, bool]]:
            return [await session.publish(subject, envelope) for subject, envelope in events]

        return self.session(work)


class EventSink:
    """Publishes a run's events on an open session from synchronous code (the session's loop runs
    in a thread); what it cannot publish goes to the outbox, so a NATS outage never fails a run."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        session: NatsSession | None,
        timeout_s: float,
        outbox: Outbox | None,
        run_id: str,
        unreachable: str | None = None,
    ):
        self._loop = loop
        self._session = session
        self._timeout_s = timeout_s
        self._outbox = outbox
        self.run_id = run_id
        self.unreachable = unreachable  # why NATS is not taking events (None: it is)
        self.kept = 0  # events kept in the outbox by this sink
        self.resent = self.resent_duplicates = 0  # kept events it sent (dropped as copies)
        self._chunks: list[tuple[Future | None, Event]] = []  # progress chunks, checked at close
        self._lock = threading.Lock()

    def publish(self, events: Sequence[Event]) -> None:
        """Publishes in order, each acked by JetStream; what is not acked is kept."""
        events = list(events)
        if self._session is not None and self.unreachable is None:
            done = 0
            try:
                for subject, envelope in events:
                    self._wait(self._session.publish(subject, envelope))
                    done += 1
                return
            except (NatsError, TimeoutError) as exc:
                self.unreachable = str(exc) or type(exc).__name__
                events = events[done:]
        self._keep(events)

    def publish_nowait(self, subject: str, envelope: Publishable) -> None:
        """In order, without waiting (progress chunks); a chunk not taken is kept at the end."""
        event: Event = (subject, envelope)  # type: ignore[assignment]
        future = None
        if self._session is not None and self.unreachable is None:
            future = asyncio.run_coroutine_threadsafe(self._session.publish(subject, envelope), self._loop)
        with self._lock:
            self._chunks.append((future, event))

    def flush(self) -> None:
        """Sends this run's kept events, oldest first (counted in `resent`, and in
        `resent_duplicates` those JetStream had); stops at the first failure, keeping the rest."""
        if self._outbox is None or self._session is None or self.unreachable is not None:
            return
        for path in self._outbox.batches(self.run_id):
            try:
                events = self._outbox.read(path).events
            except FileNotFoundError:  # sent meanwhile by another flush
                continue
            for i, kept in enumerate(events):
                try:
                    _, duplicate = self._wait(self._session.publish(*kept.event()))
                except (NatsError, TimeoutError) as exc:
                    self.unreachable = str(exc) or type(exc).__name__
                    self._outbox.done(path, events[i:])
                    return
                self.resent += 1
                self.resent_duplicates += duplicate
            self._outbox.done(path)

    def close(self) -> None:
        """Waits for the chunks in flight, then keeps those that were not taken."""
        with self._lock:
            chunks, self._chunks = self._chunks, []
        wait([f for f, _ in chunks if f is not None], timeout=self._timeout_s * 2)
        unsent = []
        for future, event in chunks:
            if future is not None and not future.done():
                future.cancel()
            if future is None or future.cancelled() or not future.done() or future.exception() is not None:
                unsent.append(event)
        self._keep(unsent)

    def _keep(self, events: Sequence[Event]) -> None:
        if not events:
            return
        if self._outbox is None:
            raise NatsError(f"{len(events)} events not published and no outbox: {self.unreachable}")
        self.kept += self._outbox.keep(self.run_id, events)

    def _wait(self, publishing: Awaitable[tuple[int, bool]]) -> tuple[int, bool]:
        return asyncio.run_coroutine_threadsafe(publishing, self._loop).result(self._timeout_s * 2)
