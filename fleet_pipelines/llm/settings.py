"""Where an engine is and how to call it: plain values that travel to Ray workers, and the
environment variables that supply them (`Variable`, read by the settings of each engine kind,
`llm.kinds`).

Kept apart from the clients (openai, ray, vllm) so that configuration imports none of them.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from ..domain.tools import ToolProtocol
from .local_server import MODEL_NAME

TOOL_PROTOCOL_DESCRIPTION = (
    "How agents call tools and give edits on repository tasks with this engine: `json` (every reply "
    "decoded under a JSON schema, so a call or an edit always parses: llama.cpp, vLLM; the choice for "
    "small models), `openai` (native tool calling: llama.cpp's jinja templates, vLLM with a tool "
    "parser), `text` (a plain-text protocol any engine takes, nothing enforced)."
)


class Variable:
    """The environment variable that supplies one field of an engine kind's settings: its name,
    then the names it is also read from (the seed system's), and its value when unset (None: the
    settings' own default, or none). `FleetSettings` holds it as the setting `setting`, validated
    and described by the field it supplies; a variable that several kinds read is one setting,
    typed by the first kind in the registry that reads it."""

    __slots__ = ("default", "names")

    def __init__(self, *names: str, default: Any = None):
        self.names, self.default = names, default

    @property
    def setting(self) -> str:
        """Its name in `FleetSettings`: FLEET_VLLM_NUM_GPUS is `vllm_num_gpus`."""
        return self.names[0].removeprefix("FLEET_").lower()


# What every kind of the stack's engine reads: the model name turns are recorded with, the tool protocol.
MODEL = Variable("FLEET_LLM_MODEL", "VLLM_MODEL", default=MODEL_NAME)
TOOL_PROTOCOL = Variable("FLEET_TOOL_PROTOCOL")


class EngineSettings(BaseModel):
    """Where the engine is and how patiently to call it. Travels to Ray workers as a value."""

    model_config = ConfigDict(frozen=True)

    base_url: str = Field(
        description="Engine base URL, e.g. http://127.0.0.1:8080/v1 (`/v1` is added if missing)."
    )
    model: str = Field(description="Model name sent with each request (vLLM: the served model name).")
    api_key: SecretStr | None = Field(
        default=None, description="Engine API key; None: the engine needs none."
    )
    slots: int | None = Field(
        default=None,
        ge=1,
        description="Requests the engine serves at once (llama.cpp --parallel, vLLM max_num_seqs): the "
        "admission queue sends no more. None: llama.cpp's own /props, else 4.",
    )
    connect_timeout_s: float = Field(default=10.0, gt=0, description="Connecting to the engine.")
    first_token_timeout_s: float = Field(
        default=180.0,
        gt=0,
        description="From sending a turn (it holds a slot) to its first token: prompt processing, which on "
        "a loaded CPU took over 60 s for three revision prompts at once.",
    )
    idle_timeout_s: float = Field(default=60.0, gt=0, description="Longest gap between two tokens of a turn.")
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description="Attempts per turn on engine errors (connection, 5xx) before any token streamed; "
        "busy (429) is never retried.",
    )
    backoff_initial_s: float = Field(default=0.5, ge=0, description="First retry backoff (exponential).")
    backoff_max_s: float = Field(default=8.0, ge=0, description="Longest retry backoff.")
    tool_protocol: ToolProtocol = Field(default="json", description=TOOL_PROTOCOL_DESCRIPTION)


class VLLMActorSettings(BaseModel):
    """The engine the actor loads and what it reserves on the cluster. Travels to Ray as a value."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(description="HF model folder (safetensors + tokenizer) or hub id vLLM loads.")
    served_model_name: str = Field(description="Model name recorded on every turn.")
    num_gpus: float = Field(
        default=1, ge=0, description="GPUs reserved by the actor (tensor parallel over them); 0 on CPU."
    )
    num_cpus: float = Field(default=1, gt=0, description="CPUs reserved by the actor.")
    dtype: str = Field(default="auto", description="vLLM dtype; float32 on CPU (bf16 gave garbage).")
    enforce_eager: bool = Field(default=False, description="Skip graph compilation (needed on CPU).")
    max_model_len: int = Field(default=4096, gt=0, description="Context length of one request.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="GPU memory share.")
    cpu_kvcache_space_gib: int | None = Field(
        default=None, description="VLLM_CPU_KVCACHE_SPACE for CPU engines (GiB of KV cache)."
    )
    cache_root: str | None = Field(default=None, description="VLLM_CACHE_ROOT of the actor process.")
    namespace: str = Field(default="fleet", description="Ray namespace of the named actor.")
    max_num_seqs: int = Field(
        default=128, ge=1, description="Requests vLLM batches at once: the admission queue's capacity."
    )
    max_concurrency: int = Field(default=256, ge=1, description="Calls the actor accepts at once.")
    load_timeout_s: float = Field(default=900.0, gt=0, description="Wait for the model to load.")
    first_token_timeout_s: float = Field(default=180.0, gt=0, description="From sending to the first token.")
    idle_timeout_s: float = Field(default=60.0, gt=0, description="Longest gap between tokens.")
    tool_protocol: ToolProtocol = Field(default="json", description=TOOL_PROTOCOL_DESCRIPTION)
    chat_template: str | None = Field(
        default=None,
        description="Jinja chat template the actor renders with instead of the model's own: one with "
        "tools (`llm.chat_template.CHATML_TOOLS` for SmolLM2) for `tool_protocol: openai` on a model "
        "whose template has none; None: the model's.",
    )

    @property
    def tensor_parallel_size(self) -> int:
        return max(1, math.floor(self.num_gpus))

    def actor_name(self) -> str:
        digest = hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]
        return f"fleet-vllm-{digest}"

    def runtime_env(self) -> dict[str, Any]:
        env = {
            "VLLM_CPU_KVCACHE_SPACE": self.cpu_kvcache_space_gib,
            "VLLM_CACHE_ROOT": self.cache_root,
        }
        return {"env_vars": {k: str(v) for k, v in env.items() if v is not None}}
