"""The client of any OpenAI-compatible engine: vLLM, Ray Serve LLM, llama.cpp's server.

Transient failures (connection refused or reset, request timeout, 429, 5xx) are retried with
exponential backoff; a 4xx that is the request's own fault is not. Errors that survive the retries
are raised as `EngineError` with a `kind` a person can act on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import openai
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from ..domain.models import Message
from .settings import EngineSettings

TRANSIENT_ERRORS = (
    openai.APIConnectionError,  # includes APITimeoutError
    openai.RateLimitError,
    openai.InternalServerError,
)


def normalize_base_url(url: str) -> str:
    """Accepts `http://host:8000` (the seed system's VLLM_URL) as well as `.../v1`."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


@dataclass(frozen=True)
class Completion:
    content: str
    model: str
    tokens_in: int
    tokens_out: int
    latency_ms: float
    attempts: int


class EngineError(Exception):
    """An engine call that failed for good. `kind` is the error type shown in events and the UI."""

    def __init__(self, kind: str, message: str, attempts: int):
        super().__init__(message)
        self.kind = kind
        self.attempts = attempts


class ChatEngine:
    def __init__(self, settings: EngineSettings):
        self.settings = settings
        self._client = openai.OpenAI(
            base_url=normalize_base_url(settings.base_url),
            api_key=settings.api_key.get_secret_value(),
            timeout=settings.request_timeout_s,
            max_retries=0,  # tenacity owns retries, so attempts are counted and reported
        )

    def complete(
        self,
        messages: list[Message],
        temperature: float,
        max_tokens: int,
        response_schema: dict | None = None,
    ) -> Completion:
        """One chat completion; with `response_schema` the engine constrains the reply to that
        JSON schema (OpenAI `response_format` json_schema: llama.cpp grammar, vLLM guided decoding)."""
        s = self.settings
        response_format = (
            {
                "type": "json_schema",
                "json_schema": {"name": "reply", "strict": True, "schema": response_schema},
            }
            if response_schema
            else openai.NOT_GIVEN
        )
        retrying = Retrying(
            retry=retry_if_exception_type(TRANSIENT_ERRORS),
            stop=stop_after_attempt(s.max_attempts),
            wait=wait_exponential(multiplier=s.backoff_initial_s, max=s.backoff_max_s),
            reraise=False,
        )
        start = time.perf_counter()
        try:
            for attempt in retrying:
                with attempt:
                    response = self._client.chat.completions.create(
                        model=s.model,
                        messages=[m.model_dump() for m in messages],
                        temperature=temperature,
                        max_tokens=max_tokens,
                        response_format=response_format,
                    )
        except RetryError as exc:
            last = exc.last_attempt.exception()
            raise EngineError(
                type(last).__name__,
                f"engine at {s.base_url} failed after {s.max_attempts} attempts: {last}",
                s.max_attempts,
            ) from last
        except openai.APIStatusError as exc:
            raise EngineError(
                type(exc).__name__, f"engine rejected the request ({exc.status_code}): {exc.message}", 1
            ) from exc
        attempts = retrying.statistics.get("attempt_number", 1)
        choice = response.choices[0]
        usage = response.usage
        return Completion(
            content=choice.message.content or "",
            model=response.model or s.model,
            tokens_in=usage.prompt_tokens if usage else 0,
            tokens_out=usage.completion_tokens if usage else 0,
            latency_ms=(time.perf_counter() - start) * 1000,
            attempts=attempts,
        )
