"""One asyncio session with NATS JetStream: ensure streams, publish with `Nats-Msg-Id`, read by sequence.

nats-py is asyncio; Dagster ops and sensors are synchronous, so callers open a session inside a
short event loop (`NatsResource.session`) and close it before returning.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar


def _import_nats_without_aiohttp() -> None:
    """nats-py imports aiohttp (~0.1 s) for its websocket transport whatever the server's scheme;
    only ws:// and wss:// servers use it (`_websocket_transport`). In a process with one thread
    (a `fleet` command), nats-py is imported with `import aiohttp` failing, as if it were not
    installed; with other threads, as nats-py does it (another thread's import of aiohttp would
    fail in that instant)."""
    if "aiohttp" in sys.modules or threading.active_count() > 1:
        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # `import aiohttp` raises ImportError
    try:
        import nats.aio.transport  # noqa: F401
    finally:
        del sys.modules["aiohttp"]


def _websocket_transport() -> None:
    """aiohttp for nats-py's websocket transport, imported now if it was left out."""
    from nats.aio import transport

    if transport.aiohttp is None:
        import aiohttp

        transport.aiohttp = aiohttp


_import_nats_without_aiohttp()

import nats  # noqa: E402  (after _defer_aiohttp)
from nats.aio.client import Client  # noqa: E402
from nats.js import JetStreamContext  # noqa: E402
from nats.js.api import RetentionPolicy, StorageType, StreamConfig  # noqa: E402
from nats.js.errors import NotFoundError  # noqa: E402

from .models import Publishable  # noqa: E402
from .options import NO_NATS, ConnectOptions  # noqa: E402
from .planning import StreamMessage  # noqa: E402
from .streams import (  # noqa: E402
    OWNER_METADATA,
    STREAMS,
    ExistingStream,
    NatsError,
    StreamAction,
    StreamPlan,
    StreamPosition,
    StreamSpec,
    plan_streams,
)

# What a lost or refusing server raises (nats.errors.Error covers JetStream API errors too).
_NATS_ERRORS = (OSError, nats.errors.Error)
_STREAM_PAGE = 256  # streams per STREAM.INFO page
_HEADER_ALLOWANCE = 512  # bytes of headers and protocol around a published payload
_MAX_PLAIN_MSG_ID = 256

T = TypeVar("T")


def _why(exc: BaseException) -> str:
    """The error's class and text (nats-py's repr leaves out the server's description)."""
    return f"{type(exc).__name__}: {exc}"


async def _silent(_: Exception) -> None:
    """nats-py prints every connection error by default; failures reach callers as exceptions."""


async def connect(options: ConnectOptions) -> NatsSession:
    if not options.url:
        raise NatsError(NO_NATS)
    if "ws://" in options.url or "wss://" in options.url:
        _websocket_transport()
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
        raise NatsError(f"NATS unreachable at {options.url}: {_why(exc)}") from exc
    return NatsSession(client, client.jetstream(timeout=options.request_timeout_s), options.request_timeout_s)


class NatsSession:
    def __init__(self, client: Client, js: JetStreamContext, request_timeout_s: float = 5.0):
        self.client = client
        self.js = js
        self.request_timeout_s = request_timeout_s

    async def close(self) -> None:
        if not self.client.is_closed:
            await self.client.close()

    async def existing_streams(self) -> list[ExistingStream]:
        """Every stream on the server, marked as ours or not (one request per 256 streams)."""
        found: list[ExistingStream] = []
        while True:
            page = await self.js.streams_info(offset=len(found))
            found += [
                ExistingStream(
                    name=info.config.name,
                    subjects=tuple(info.config.subjects or ()),
                    owned=_owned(info.config.metadata),
                    max_age_s=info.config.max_age or 0.0,
                    duplicate_window_s=info.config.duplicate_window or 0.0,
                    replicas=info.config.num_replicas or 1,
                )
                for info in page
            ]
            if not page or len(page) < _STREAM_PAGE:
                return found

    async def ensure_streams(
        self, specs: Sequence[StreamSpec] = STREAMS, replicas: int = 1, dry_run: bool = False
    ) -> list[StreamPlan]:
        """Creates our missing streams and updates ours that differ; streams of others are only
        read (a spec whose subjects they capture uses them; one they overlap is a conflict).

        Never deletes a stream or its messages. With `dry_run`, plans without changing anything.
        """
        try:
            plans = plan_streams(specs, await self.existing_streams(), replicas)
            if not dry_run:
                for plan in plans:
                    await self._apply(plan, replicas)
        except _NATS_ERRORS as exc:
            raise NatsError(f"ensuring streams: {_why(exc)}") from exc
        return plans

    async def _apply(self, plan: StreamPlan, replicas: int) -> None:
        spec = plan.spec
        wanted = {
            "subjects": list(spec.subjects),
            "max_age": spec.max_age_s,
            "duplicate_window": spec.duplicate_window_s,
            "num_replicas": replicas,
        }
        if plan.action is StreamAction.CREATE:
            await self.js.add_stream(
                StreamConfig(
                    name=spec.name,
                    description="fleet_pipelines events",
                    storage=StorageType.FILE,
                    retention=RetentionPolicy.LIMITS,
                    metadata=dict(OWNER_METADATA),
                    **wanted,
                )
            )
        elif plan.action is StreamAction.UPDATE:
            current = (await self.js.stream_info(spec.name)).config
            await self.js.update_stream(current.evolve(**wanted))

    async def stream_for(self, subject: str) -> str:
        """The stream that captures `subject` (ours or another system's)."""
        try:
            return await self.js.find_stream_name_by_subject(subject)
        except NotFoundError as exc:
            raise NatsError(f"no stream captures {subject}; run `fleet nats init`") from exc
        except _NATS_ERRORS as exc:
            raise NatsError(f"finding the stream of {subject}: {_why(exc)}") from exc

    async def position(self, stream: str) -> StreamPosition:
        try:
            info = await self.js.stream_info(stream)
        except _NATS_ERRORS as exc:
            raise NatsError(f"stream info of {stream}: {_why(exc)}") from exc
        return StreamPosition(
            stream=stream,
            first_seq=info.state.first_seq,
            last_seq=info.state.last_seq,
            created=info.created.isoformat() if info.created else "",
        )

    async def last_seq(self, stream: str) -> int:
        return (await self.position(stream)).last_seq

    def fits(self, subject: str, event: Publishable) -> bool:
        """Whether the event is under the server's max_payload (headers and subject included)."""
        return len(event.encoded()) + len(subject) + _HEADER_ALLOWANCE <= self.client.max_payload

    async def publish(self, subject: str, event: Publishable) -> tuple[int, bool]:
        """Publishes and waits for the JetStream ack: (stream sequence, dropped as a duplicate)."""
        try:
            ack = await self.js.publish(
                subject, event.encoded(), headers={"Nats-Msg-Id": nats_msg_id(event.idempotency_key)}
            )
        except _NATS_ERRORS as exc:
            raise NatsError(f"publishing to {subject}: {_why(exc)}") from exc
        return ack.seq, bool(ack.duplicate)

    @contextlib.asynccontextmanager
    async def arrivals(self, subject: str) -> AsyncIterator[Callable[[float], Awaitable[bool]]]:
        """While open, `await arrived(timeout_s)` is True as soon as a message is published on
        `subject` (core delivery, which JetStream publishes get too), False after `timeout_s`.
        Open it before reading the stream, so that nothing published after the read is missed."""
        try:
            subscription = await self.client.subscribe(subject)
        except _NATS_ERRORS as exc:
            raise NatsError(f"subscribing to {subject}: {_why(exc)}") from exc

        async def arrived(timeout_s: float) -> bool:
            try:
                await subscription.next_msg(timeout=timeout_s)
            except nats.errors.TimeoutError:
                return False
            return True

        try:
            yield arrived
        finally:
            with contextlib.suppress(*_NATS_ERRORS):
                await subscription.unsubscribe()

    async def start_of_newest(self, stream: str, subject: str, count: int, deadline: float) -> int:
        """The stream sequence after which the newest `count` messages on `subject` begin (0:
        there are no more than `count`), for `read_after` to read those and no older ones.

        Counts and walks the subject's sequences through an ephemeral, headers-only consumer of our
        own (nothing acknowledged, deleted after), a batch of up to 1,000 sequences a request."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            headers_only=True,
            mem_storage=True,
            inactive_threshold=30.0,
        )
        try:
            sub = await self.js.pull_subscribe(subject, stream=stream, config=config)
            info = None
            try:
                info = await sub.consumer_info()
                skip, start = info.num_pending - count, 0
                while skip > 0 and time.monotonic() < deadline:
                    messages = await sub.fetch(min(skip, 1_000), timeout=self.request_timeout_s)
                    for message in messages[:skip]:
                        start = message.metadata.sequence.stream
                    skip -= len(messages)
                return start
            finally:
                await sub.unsubscribe()
                if info is not None:  # else its inactive_threshold removes it
                    with contextlib.suppress(*_NATS_ERRORS):
                        await self.js.delete_consumer(stream, info.name)
        except (TimeoutError, *_NATS_ERRORS) as exc:
            raise NatsError(f"counting {subject} in {stream}: {_why(exc)}") from exc

    async def read_after(
        self, stream: str, subject: str, after_seq: int, max_messages: int, deadline: float
    ) -> AsyncIterator[StreamMessage]:
        """Messages on `subject` with stream sequence > `after_seq`, in order, until the stream ends,
        `max_messages` are read or `time.monotonic()` passes `deadline`.

        Stateless (a direct get of the next message by sequence, no consumer): the caller's cursor
        is the only record of progress, so nothing is acknowledged on anyone's behalf. Headers are
        parsed here from their bytes, so no header value of a message can fail the read.
        """
        next_seq, count = after_seq + 1, 0
        while count < max_messages and time.monotonic() < deadline:
            request = json.dumps({"seq": next_seq, "next_by_subj": subject}).encode()
            try:
                reply = await self.client.request(
                    f"$JS.API.STREAM.MSG.GET.{stream}", request, timeout=self.request_timeout_s
                )
                answer = json.loads(reply.data)
            except _NATS_ERRORS as exc:
                raise NatsError(f"reading {stream} after seq {next_seq - 1}: {_why(exc)}") from exc
            if "error" in answer:
                if answer["error"].get("code") == 404:
                    return
                raise NatsError(f"reading {stream} after seq {next_seq - 1}: {answer['error']}")
            raw = answer["message"]
            count += 1
            next_seq = raw["seq"] + 1
            headers, msg_id = _parse_headers(base64.b64decode(raw.get("hdrs") or ""))
            yield StreamMessage(
                stream=stream,
                seq=raw["seq"],
                subject=raw["subject"],
                data=base64.b64decode(raw.get("data") or ""),
                headers=headers,
                msg_id=msg_id,
            )


def _owned(metadata: dict[str, str] | None) -> bool:
    return all((metadata or {}).get(k) == v for k, v in OWNER_METADATA.items())


def nats_msg_id(key: str) -> str:
    """The `Nats-Msg-Id` of an idempotency key: the key itself when it is short printable ASCII,
    else a hash of its bytes, so distinct keys never collapse into one header value."""
    if len(key) <= _MAX_PLAIN_MSG_ID and key.isascii() and key.isprintable():
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _parse_headers(block: bytes) -> tuple[dict[str, str], str | None]:
    """NATS headers (`NATS/1.0` line, then `Name: value` lines) as text, and the message id.

    A value that is not UTF-8 is kept with backslash escapes; the message id is its UTF-8 text, or
    a hash of its bytes when it is not UTF-8.
    """
    headers: dict[str, str] = {}
    msg_id = None
    for line in block.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name.strip().isascii():
            continue
        key, value = name.strip().decode("ascii"), value.strip()
        headers[key] = value.decode("utf-8", "backslashreplace")
        if key.lower() == "nats-msg-id":
            try:
                msg_id = value.decode("utf-8")
            except UnicodeDecodeError:
                msg_id = "sha256:" + hashlib.sha256(value).hexdigest()
    return headers, msg_id


def run_session(
    options: ConnectOptions, work: Callable[[NatsSession], Awaitable[T]], stream_replicas: int | None = None
) -> T:
    """Runs `work` in a short event loop on a fresh connection; with `stream_replicas`, the
    streams are ensured first (with that many replicas). Raises NatsError when the server cannot
    be reached."""

    async def main() -> T:
        session = await connect(options)
        try:
            if stream_replicas is not None:
                await session.ensure_streams(replicas=stream_replicas)
            return await work(session)
        finally:
            await session.close()

    return asyncio.run(main())
