"""vLLM on CPU, both backends: time to ready, tokens/s single vs concurrent, resident memory.

Run in the vLLM env: `make install-vllm model && .venv-vllm/bin/python benchmarks/vllm_engines.py`.
One engine at a time: the OpenAI server first (stopped), then the Ray actor on a fresh Ray head.
Figures depend on the machine and its load; ratios in one run are what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from fleet_pipelines import stack
from fleet_pipelines.domain.models import Message
from fleet_pipelines.llm.engine import ChatCall, ChatEngine, EngineSettings
from fleet_pipelines.llm.local_server import MODEL_NAME, fetch_model
from fleet_pipelines.llm.vllm_actor import (
    VLLMActorEngine,
    VLLMActorSettings,
    convert_gguf_to_hf,
    engine_actor,
)
from fleet_pipelines.resources.ray_cluster import present_ray_token

PROMPT = (Message(role="user", content="Write a Python function that reverses a string, with a docstring."),)


def blocking(make_engine):
    """A synchronous `complete(call)` over a streaming engine (one event loop, and so one fresh
    engine, per call: threads run calls at once)."""
    return lambda call: asyncio.run(make_engine().stream(call))


def rss_mb(pid: int) -> float:
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def throughput(complete, concurrency: int, max_tokens: int) -> tuple[float, float]:
    """(tokens/s over the batch, wall seconds) for `concurrency` simultaneous turns."""
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda _: complete(ChatCall(PROMPT, 0.0, max_tokens)), range(concurrency)))
    wall = time.perf_counter() - start
    return sum(c.tokens_out for c in done) / wall, wall


def report(name: str, ready_s: float, mem_mb: float, complete, concurrency: int, max_tokens: int) -> None:
    complete(ChatCall(PROMPT, 0.0, 8))  # warm-up
    single, _ = throughput(complete, 1, max_tokens)
    many, wall = throughput(complete, concurrency, max_tokens)
    print(
        f"{name}: ready {ready_s:.1f} s, RSS {mem_mb:.0f} MiB, {single:.1f} tok/s single, "
        f"{many:.1f} tok/s over {concurrency} concurrent ({wall:.1f} s), ratio {many / single:.2f}x",
        flush=True,
    )


def bench_server(hf_model: Path, logs: Path, concurrency: int, max_tokens: int) -> None:
    port = stack.free_port()
    start = time.perf_counter()
    service = stack.launch(
        "vllm-bench-server",
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            f"--model={hf_model}",
            f"--served-model-name={MODEL_NAME}",
            f"--port={port}",
            "--dtype=float32",
            "--enforce-eager",
            "--max-model-len=2048",
        ],
        logs,
        env={
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(logs / "vllm-cache"),
            "HF_HUB_OFFLINE": "1",
        },
    )
    try:
        service.wait_ready(lambda: stack.http_ok(f"http://127.0.0.1:{port}/health"), 600)
        ready = time.perf_counter() - start
        settings = EngineSettings(base_url=f"http://127.0.0.1:{port}/v1", model=MODEL_NAME)
        complete = blocking(lambda: ChatEngine(settings))
        report("openai server", ready, rss_mb(service.process.pid), complete, concurrency, max_tokens)
    finally:
        service.stop()


def bench_actor(hf_model: Path, logs: Path, concurrency: int, max_tokens: int) -> None:
    import ray

    token = stack.ray_auth_token(logs)
    head = stack.start_ray_head(logs, stack.free_port(), token)
    try:
        present_ray_token(str(token))
        ray.init(address="auto", log_to_driver=False)
        settings = VLLMActorSettings(
            num_gpus=0,
            model=str(hf_model),
            served_model_name=MODEL_NAME,
            dtype="float32",
            enforce_eager=True,
            max_model_len=2048,
            cpu_kvcache_space_gib=1,
            cache_root=str(logs / "vllm-cache"),
        )
        start = time.perf_counter()
        complete = blocking(lambda: VLLMActorEngine(settings))
        complete(ChatCall(PROMPT, 0.0, 1))  # returns once the model is loaded
        ready = time.perf_counter() - start
        pid = ray.get(engine_actor(settings).stats.remote())["pid"]
        report("ray actor", ready, rss_mb(pid), complete, concurrency, max_tokens)
    finally:
        ray.shutdown()
        head.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    gguf = fetch_model()
    start = time.perf_counter()
    hf_model = convert_gguf_to_hf(gguf, gguf.with_name(f"{MODEL_NAME}-hf"))
    print(f"HF model ready in {time.perf_counter() - start:.1f} s (0 when cached): {hf_model}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        bench_server(hf_model, Path(tmp), args.concurrency, args.max_tokens)
        bench_actor(hf_model, Path(tmp), args.concurrency, args.max_tokens)


if __name__ == "__main__":
    main()
