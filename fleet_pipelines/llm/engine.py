"""The streaming client of any OpenAI-compatible engine: vLLM, Ray Serve LLM, llama.cpp's server.

Every completion is requested with `stream=True`. There is no total request timeout: a request is
sent only once the engine has a free slot (see `dispatch.admission`), so what is timed is service,
and service is judged by two clocks: the first token must come within `first_token_timeout_s` of
sending, and no gap between tokens may exceed `idle_timeout_s`. A long answer that keeps streaming
is never cut, except by the deliberation deadline (the caller's). Leaving the stream early
(cancelled, abandoned, past the deadline) closes the HTTP response, which makes the engine stop
generating for it.

Retries (tenacity, exponential backoff) are for errors only: connection refused or reset, and 5xx,
and only while no token has streamed yet. A 429 ("busy") is never retried: admission is what keeps
requests off a full engine. A stall (first-token or idle timeout) is not retried either: the
engine has the slot and is not answering. Errors that end a turn are raised as `EngineError` with a
`kind` a person can act on.

Each request opens its own connection (no keep-alive pool): llama.cpp's server answers a streamed
completion with `Keep-Alive: timeout=5, max=100` and closes the connection right after its last
chunk, so a pooled connection taken at once by the next turn (the admission queue sends one the
moment a slot frees) is often already closing: that turn failed its first attempt and waited a
backoff. A local connection costs far less than a turn.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httpx
import openai
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from ..domain.models import Message, TurnRequest
from ..domain.tools import render_call
from .settings import EngineSettings

OnText = Callable[[str], None]
"""Called with each piece of text as it streams in (in order)."""


def normalize_base_url(url: str) -> str:
    """Accepts `http://host:8000` (the seed system's VLLM_URL) as well as `.../v1`."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def llama_cpp_slots(base_url: str, timeout_s: float = 3.0) -> int | None:
    """The parallel slots of a llama.cpp server (`GET /props` -> total_slots); None for other engines."""
    url = normalize_base_url(base_url).removesuffix("/v1") + "/props"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            slots = json.load(response).get("total_slots")
    except (OSError, ValueError):
        return None
    return slots if isinstance(slots, int) and slots > 0 else None


@dataclass(frozen=True)
class Completion:
    content: str
    model: str
    tokens_in: int
    tokens_out: int
    latency_ms: float  # from sending to the last token (service time)
    first_token_ms: float
    attempts: int
    tokens_cached: int = 0  # prompt tokens the engine read from its prompt cache


@dataclass(frozen=True)
class ChatCall:
    """One chat completion an `Engine` is asked for: what is sent, nothing about how the text is
    watched (that is `stream`'s `on_text`)."""

    messages: tuple[Message, ...]  # the conversation so far, oldest first
    temperature: float  # sampling temperature (0: greedy)
    max_tokens: int  # the most tokens the reply may have
    stop: tuple[str, ...] = ()  # stop sequences: the engine ends the reply at the first one
    response_schema: dict | None = None  # JSON schema the engine constrains the reply to; None: free
    tools: tuple[dict, ...] = ()  # OpenAI tools offered (native tool calling); none: the text protocol
    slot: int | None = None  # the engine slot to decode it in (llama.cpp's `id_slot`); None: any

    @classmethod
    def for_request(cls, request: TurnRequest, slot: int | None = None) -> ChatCall:
        """The engine call of one turn, decoded in `slot` (None: the engine picks)."""
        return cls(
            messages=tuple(request.messages),
            temperature=request.temperature,
            max_tokens=request.max_tokens,
            stop=tuple(request.stop),
            response_schema=request.response_schema,
            tools=tuple(request.tools or ()),
            slot=slot,
        )


class Engine(Protocol):
    """What the admission queue sends turns to: `ChatEngine` (any OpenAI-compatible server) and
    `VLLMActorEngine` (vLLM's engine in a Ray actor). Errors that end a turn raise `EngineError`."""

    async def stream(self, call: ChatCall, on_text: OnText | None = None) -> Completion:
        """One streamed chat completion, each piece of its text passed to `on_text` as it comes; with
        the call's `response_schema` the reply is that JSON schema's; with its `tools` the calls
        returned are written into the reply in the text protocol."""
        ...


class EngineError(Exception):
    """An engine call that failed for good. `kind` is the error type shown in events and the UI."""

    def __init__(self, kind: str, message: str, attempts: int):
        super().__init__(message)
        self.kind = kind
        self.attempts = attempts


class _Streamed(Exception):
    """An error after tokens were already streamed: not retried (the text is already out)."""

    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


def retryable(exc: BaseException) -> bool:
    """Connection errors and 5xx, before any token streamed. Never 429 (busy) nor our own timeouts."""
    if isinstance(exc, openai.APITimeoutError):
        return False
    return isinstance(exc, openai.APIConnectionError | openai.InternalServerError)


async def next_within(iterator, timeout_s: float, kind: str, attempts: int):
    """The iterator's next item, or EngineError(kind) when it takes longer than `timeout_s`."""
    try:
        return await asyncio.wait_for(anext(iterator), timeout_s)
    except TimeoutError:
        raise EngineError(kind, f"no token for {timeout_s:.0f} s ({kind})", attempts) from None


class ChatEngine:
    """Streams chat completions from one OpenAI-compatible server (one connection pool, asyncio)."""

    def __init__(self, settings: EngineSettings):
        self.settings = settings
        s = settings
        self._client = openai.AsyncOpenAI(
            base_url=normalize_base_url(s.base_url),
            api_key=s.api_key.get_secret_value() if s.api_key else "not-needed",
            # A backstop only: the first-token and idle clocks below are the real ones.
            timeout=openai.Timeout(
                connect=s.connect_timeout_s,
                read=max(s.first_token_timeout_s, s.idle_timeout_s) + 30,
                write=s.connect_timeout_s,
                pool=None,
            ),
            max_retries=0,  # tenacity owns retries, so attempts are counted and reported
            http_client=openai.DefaultAsyncHttpxClient(  # a connection per request: see the docstring
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=0)
            ),
        )

    async def stream(self, call: ChatCall, on_text: OnText | None = None) -> Completion:
        """One streamed chat completion; with the call's `response_schema` the engine constrains the
        reply to that JSON schema (OpenAI `response_format` json_schema: llama.cpp grammar, vLLM
        guided decoding). With `tools` (OpenAI tool calling) the streamed `tool_calls` deltas are
        assembled by index (id, name, argument pieces) and each call is written into the reply in the
        text protocol's form with its id (`domain.tools.render_call`), so one parser reads both and
        the call's `tool` answer names it. With a `slot`, llama.cpp decodes it in that slot, reusing
        the prompt prefix the slot holds (`id_slot`, `cache_prompt`); only for llama.cpp, whose slots
        the ids are."""
        s = self.settings
        attempts = 0
        retrying = AsyncRetrying(
            retry=retry_if_exception(retryable),
            stop=stop_after_attempt(s.max_attempts),
            wait=wait_exponential(multiplier=s.backoff_initial_s, max=s.backoff_max_s),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    return await self._attempt(call, on_text, attempts)
        except _Streamed as exc:
            raise EngineError(
                type(exc.cause).__name__, f"engine failed mid-stream: {exc.cause}", attempts
            ) from exc
        except openai.APIStatusError as exc:
            retried = f" after {attempts} attempts" if retryable(exc) else ""
            raise EngineError(
                type(exc).__name__,
                f"engine at {s.base_url} failed{retried} ({exc.status_code}): {exc.message}",
                attempts,
            ) from exc
        except openai.APIError as exc:
            raise EngineError(
                type(exc).__name__,
                f"engine at {s.base_url} failed after {attempts} attempts: {exc}",
                attempts,
            ) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def _attempt(self, call: ChatCall, on_text: OnText | None, attempts: int) -> Completion:
        s = self.settings
        response_format = (
            {
                "type": "json_schema",
                "json_schema": {"name": "reply", "strict": True, "schema": call.response_schema},
            }
            if call.response_schema
            else openai.NOT_GIVEN
        )
        start = time.perf_counter()
        opening = self._client.chat.completions.create(
            model=s.model,
            messages=[m.wire() for m in call.messages],
            temperature=call.temperature,
            max_tokens=call.max_tokens,
            stop=list(call.stop) or openai.NOT_GIVEN,
            response_format=response_format,
            tools=list(call.tools) or openai.NOT_GIVEN,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=None if call.slot is None else {"id_slot": call.slot, "cache_prompt": True},
        )
        try:
            stream = await asyncio.wait_for(opening, s.first_token_timeout_s)
        except TimeoutError:
            raise EngineError(
                "FirstTokenTimeout", f"no answer for {s.first_token_timeout_s:.0f} s", attempts
            ) from None
        parts: list[str] = []
        calls: dict[int, list[str]] = {}  # streamed tool calls by index: id, name, argument pieces
        first_token_ms = 0.0
        model, tokens_in, tokens_out, tokens_cached = s.model, 0, 0, 0
        async with stream:  # leaving the block (error, cancel, deadline) closes the response
            chunks = aiter(stream)
            while True:
                waited = (time.perf_counter() - start) if not parts else 0.0
                timeout, kind = (
                    (s.first_token_timeout_s - waited, "FirstTokenTimeout")
                    if not parts
                    else (s.idle_timeout_s, "IdleTimeout")
                )
                try:
                    chunk = await next_within(chunks, max(timeout, 0.01), kind, attempts)
                except StopAsyncIteration:
                    break
                except openai.APIError as exc:
                    if parts:
                        raise _Streamed(exc) from exc
                    raise
                model = chunk.model or model
                if chunk.usage:
                    tokens_in, tokens_out = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                    details = chunk.usage.prompt_tokens_details  # llama.cpp, vLLM: cached_tokens
                    tokens_cached = (details.cached_tokens or 0) if details else 0
                delta = chunk.choices[0].delta if chunk.choices else None
                for call in (delta.tool_calls or []) if delta is not None else []:
                    pieces = calls.setdefault(call.index, ["", "", ""])
                    pieces[0] = pieces[0] or call.id or ""
                    if call.function is not None:
                        pieces[1] += call.function.name or ""
                        pieces[2] += call.function.arguments or ""
                text = delta.content if delta is not None else None
                if text:
                    if not parts:
                        first_token_ms = (time.perf_counter() - start) * 1000
                    parts.append(text)
                    if on_text is not None:
                        on_text(text)
        for call_id, name, arguments in (calls[i] for i in sorted(calls)):
            rendered = "\n" + render_call(name, arguments, call_id)
            parts.append(rendered)
            if on_text is not None:
                on_text(rendered)
        return Completion(
            content="".join(parts),
            model=model,
            tokens_in=tokens_in,
            tokens_out=tokens_out or len(parts),
            tokens_cached=tokens_cached,
            latency_ms=(time.perf_counter() - start) * 1000,
            first_token_ms=first_token_ms,
            attempts=attempts,
        )
