"""Environment variables the platform reads, with the seed system's names as aliases."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_LLM_URL = "http://127.0.0.1:8080/v1"


def env(*names: str, default: str) -> str:
    """The first of `names` that is set (our FLEET_* name first, then legacy aliases)."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return default


def llm_base_url() -> str:
    return env("FLEET_LLM_BASE_URL", "VLLM_URL", default=DEFAULT_LLM_URL)


def llm_model() -> str:
    from .llm.local_server import MODEL_NAME

    return env("FLEET_LLM_MODEL", "VLLM_MODEL", default=MODEL_NAME)


def max_tokens() -> int:
    return int(env("FLEET_MAX_TOKENS", default="1024"))


def state_dir() -> Path:
    """Where the local stack keeps its state (models, NATS store, Dagster home, asset values)."""
    return Path(env("FLEET_STATE_DIR", default=".fleet")).resolve()


def storage_path() -> str:
    return env("FLEET_STORAGE_PATH", default=str(state_dir() / "storage"))
