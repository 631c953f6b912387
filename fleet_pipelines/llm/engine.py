"""The streaming client of any OpenAI-compatible engine: vLLM, Ray Serve LLM, llama.cpp's server.

Every completion is requested with `stream=True`. There is no total request timeout: a request is
sent only once the engine has a free slot (see `dispatch.admission`), so what is timed is service,
and service is judged by two clocks: the first token must come within `first_token_timeout_s` of
sending, and no gap between tokens may exceed `idle_timeout_s`. A long answer that keeps streaming
is never cut, except by the deliberation deadline (the caller's). Leaving the stream early
(cancelled, abandoned, past the deadline) closes the HTTP response, which makes the engine stop
generating for it.

Every request fits the engine's window: the window is read from the server (`engine_window`) and
each request is counted by the server itself (`prompt_tokens`: llama.cpp's `/apply-template` and
`/tokenize`, vLLM's `/tokenize`), never by another model's tokenizer. A reply is capped to what
the window leaves; a request that leaves no room for one is not sent (`EngineError` kind
`ContextExceeded`), and an engine's own refusal for size (llama.cpp's `exceed_context_size_error`,
vLLM's 400) is reported with the same kind.

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
import dataclasses
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
from ..domain.tools import MIN_REPLY_TOKENS, render_call
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


def _get_json(url: str, api_key: str | None = None, body: dict | None = None, timeout_s: float = 10.0):
    """GET (or POST `body` to) `url` and decode the JSON answer; None when it cannot be read."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


def engine_window(base_url: str, api_key: str | None = None) -> int | None:
    """The context window of one request on the server, in tokens, as the server reports it:
    vLLM's `max_model_len` or llama.cpp's per-slot `n_ctx` (`GET /v1/models`), else llama.cpp's
    `GET /props` (`default_generation_settings.n_ctx`); None when it reports neither."""
    models = _get_json(normalize_base_url(base_url) + "/models", api_key) or {}
    for entry in models.get("data", []) if isinstance(models, dict) else []:
        size = entry.get("max_model_len") or (entry.get("meta") or {}).get("n_ctx")
        if isinstance(size, int) and size > 0:
            return size
    props = _get_json(normalize_base_url(base_url).removesuffix("/v1") + "/props", api_key) or {}
    size = (props.get("default_generation_settings") or {}).get("n_ctx") if isinstance(props, dict) else None
    return size if isinstance(size, int) and size > 0 else None


def served(base_url: str, api_key: str | None = None) -> str:
    """What the server serves, for a person: its slots and each one's window, as it reports them."""
    window, slots = engine_window(base_url, api_key), llama_cpp_slots(base_url)
    size = f"{window:,}-token window" if window else "window not reported"
    return f"{slots} slots, each a {size}" if slots else size


def prompt_tokens(
    base_url: str, messages: list[dict], tools: list[dict], model: str = "", api_key: str | None = None
) -> int | None:
    """The prompt tokens of a chat request, counted by the server with its own template and
    tokenizer: llama.cpp renders it (`POST /apply-template`) and tokenizes the text (`POST
    /tokenize`); vLLM's server counts chat messages at `POST /tokenize`. None when the server
    counts neither way."""
    root = normalize_base_url(base_url).removesuffix("/v1")
    chat = {"messages": messages, **({"tools": tools} if tools else {})}
    rendered = _get_json(root + "/apply-template", api_key, chat)
    if isinstance(rendered, dict) and isinstance(rendered.get("prompt"), str):
        tokens = _get_json(root + "/tokenize", api_key, {"content": rendered["prompt"], "add_special": True})
        return len(tokens["tokens"]) if isinstance(tokens, dict) and "tokens" in tokens else None
    counted = _get_json(root + "/tokenize", api_key, {"model": model, **chat, "add_generation_prompt": True})
    count = counted.get("count") if isinstance(counted, dict) else None
    return count if isinstance(count, int) else None


@dataclass(frozen=True)
class EngineMeter:
    """An HTTP engine's window and its own count of a request (`domain.tool_turns.Meter`)."""

    settings: EngineSettings
    window: int

    @classmethod
    def of(cls, settings: EngineSettings) -> EngineMeter | None:
        """The engine's meter; None when the server does not report its window."""
        window = engine_window(settings.base_url, _key(settings))
        return cls(settings, window) if window else None

    def count_call(self, call: ChatCall) -> int | None:
        return prompt_tokens(
            self.settings.base_url,
            [m.wire() for m in call.messages],
            list(call.tools),
            self.settings.model,
            _key(self.settings),
        )

    def count(self, request: TurnRequest) -> int | None:
        return self.count_call(ChatCall.for_request(request))

    def fit(self, call: ChatCall) -> ChatCall:
        """The call with its reply capped to what the window leaves; EngineError
        ("ContextExceeded") when it leaves less than MIN_REPLY_TOKENS: such a call is never sent."""
        count = self.count_call(call)
        if count is None:
            return call
        left = self.window - count
        if left < MIN_REPLY_TOKENS:
            raise EngineError(
                "ContextExceeded",
                f"request ({count} tokens) does not fit the engine's context window ({self.window} "
                "tokens) with room for a reply: not sent",
                0,
            )
        return call if call.max_tokens <= left else dataclasses.replace(call, max_tokens=left)


def _key(settings: EngineSettings) -> str | None:
    return settings.api_key.get_secret_value() if settings.api_key else None


def context_exceeded(exc: openai.APIStatusError) -> bool:
    """Whether the engine refused a request for its size: llama.cpp's `exceed_context_size_error`
    or vLLM's 400 on the model's maximum context length."""
    text = f"{exc.body} {exc.message}".lower()
    return exc.status_code == 400 and (
        "exceed_context_size_error" in text or "maximum context length" in text or "context size" in text
    )


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
        self._meter: EngineMeter | bool | None = None  # read on first use; False: no window reported
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
        if self._meter is None:
            self._meter = await asyncio.to_thread(EngineMeter.of, s) or False
        if self._meter:
            call = await asyncio.to_thread(self._meter.fit, call)
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
                "ContextExceeded" if context_exceeded(exc) else type(exc).__name__,
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
