"""Resources for the engine and the council that calls it through Ray."""

from __future__ import annotations

from typing import Literal

import dagster as dg
from pydantic import Field, SecretStr

from ..dispatch.ray_dispatch import DispatchSettings, RayTurnDispatcher
from ..domain.council import CouncilSettings
from ..domain.scoring import ScoringWeights
from ..llm.engine import EngineSettings
from ..llm.vllm_actor import VLLMActorSettings
from ..scoring.sandbox import SandboxLimits


class LLMEngineResource(dg.ConfigurableResource):
    """Any OpenAI-compatible engine: llama.cpp locally, vLLM or Ray Serve LLM in production."""

    base_url: str = Field(
        description="Engine base URL, e.g. http://127.0.0.1:8080/v1 (`/v1` is added if missing)."
    )
    model: str = Field(description="Model name sent with each request (vLLM: the served model name).")
    api_key: str | None = Field(
        default=None, description="API key; pass dg.EnvVar('FLEET_LLM_API_KEY') so it never shows in the UI."
    )
    request_timeout_s: float = Field(default=60.0, description="Timeout of one HTTP request to the engine.")
    max_attempts: int = Field(
        default=3, description="Attempts per turn on transient errors (5xx, 429, refused)."
    )

    def settings(self) -> EngineSettings:
        return EngineSettings(
            base_url=self.base_url,
            model=self.model,
            api_key=SecretStr(self.api_key or "not-needed"),
            request_timeout_s=self.request_timeout_s,
            max_attempts=self.max_attempts,
        )


class VLLMActorConfig(dg.Config):
    """vLLM's own engine in a Ray actor (engine_backend `vllm_actor`); GPU path untested here."""

    model: str = Field(description="HF model folder (safetensors + tokenizer) or hub id vLLM loads.")
    served_model_name: str = Field(description="Model name recorded on every turn.")
    num_gpus: float = Field(default=1, description="GPUs per engine actor (tensor parallel over them).")
    num_cpus: float = Field(default=1, description="CPUs reserved by the engine actor.")
    dtype: str = Field(default="auto", description="vLLM dtype; float32 on CPU.")
    enforce_eager: bool = Field(default=False, description="Skip graph compilation (set on CPU).")
    max_model_len: int = Field(default=4096, description="Context length of one request.")
    cpu_kvcache_space_gib: int | None = Field(
        default=None, description="KV cache GiB of a CPU engine (VLLM_CPU_KVCACHE_SPACE)."
    )
    cache_root: str | None = Field(default=None, description="VLLM_CACHE_ROOT of the engine actor.")

    def settings(self) -> VLLMActorSettings:
        return VLLMActorSettings(**self.model_dump())


class CouncilResource(dg.ConfigurableResource):
    """How councils sample, how their turns are dispatched to Ray, and how proposals are scored."""

    llm: LLMEngineResource = Field(description="The engine every agent turn calls.")
    engine_backend: Literal["openai", "vllm_actor"] = Field(
        default="openai",
        description="openai: turns call `llm` over HTTP; vllm_actor: turns go to the vLLM engine actor.",
    )
    vllm_actor: VLLMActorConfig | None = Field(
        default=None, description="The engine actor, required when engine_backend is vllm_actor."
    )
    temperature: float = Field(default=0.7, description="Baseline temperature; diversity agents use x1.3.")
    max_tokens: int = Field(default=2048, description="Completion token limit of one turn.")
    num_cpus_per_turn: float = Field(
        default=0.05, description="Ray CPUs reserved per turn; turns are I/O-bound, so a small fraction."
    )
    max_worker_retries: int = Field(default=3, description="Ray re-runs of a turn whose worker process died.")
    weight_code_present: float = Field(default=0.05, description="Scoring weight: code blocks present.")
    weight_code_parses: float = Field(
        default=0.20,
        description="Scoring weight: share of code blocks that parse (Python, JSON, YAML, Dockerfile).",
    )
    weight_lint: float = Field(
        default=0.10, description="Scoring weight: ruff on the extracted Python, 1 - 0.2 per issue."
    )
    weight_tests: float = Field(
        default=0.35,
        description="Scoring weight: share of the task's tests and examples passed in the sandbox.",
    )
    weight_requirement_coverage: float = Field(
        default=0.15, description="Scoring weight: share of requirements met (each with a quote)."
    )
    weight_sections: float = Field(default=0.05, description="Scoring weight: requested sections present.")
    weight_judge: float = Field(
        default=0.10, description="Scoring weight: the LLM judge's rubric score / 10; it also breaks ties."
    )
    judge_max_tokens: int = Field(
        default=160,
        description="Completion token limit of a judge turn (a JSON verdict, schema-constrained).",
    )
    sandbox_wall_s: float = Field(default=10.0, description="Sandbox: wall-clock limit of one test run.")
    sandbox_cpu_s: float = Field(default=5.0, description="Sandbox: CPU-seconds limit of one test run.")
    sandbox_memory_mb: int = Field(default=512, description="Sandbox: address-space limit in MiB.")
    sandbox_max_processes: int = Field(
        default=32, description="Sandbox: process limit (RLIMIT_NPROC of the sandbox user)."
    )
    quorum: int | None = Field(
        default=None,
        description="Agents with a final proposal needed for a decision; default a majority of the council.",
    )

    def council_settings(self) -> CouncilSettings:
        return CouncilSettings(temperature=self.temperature, max_tokens=self.max_tokens)

    def scoring_weights(self) -> ScoringWeights:
        return ScoringWeights(
            code_present=self.weight_code_present,
            code_parses=self.weight_code_parses,
            lint=self.weight_lint,
            tests=self.weight_tests,
            requirement_coverage=self.weight_requirement_coverage,
            sections=self.weight_sections,
            judge=self.weight_judge,
        )

    def sandbox_limits(self) -> SandboxLimits:
        return SandboxLimits(
            wall_s=self.sandbox_wall_s,
            cpu_s=self.sandbox_cpu_s,
            memory_mb=self.sandbox_memory_mb,
            max_processes=self.sandbox_max_processes,
        )

    def engine_settings(self) -> EngineSettings | VLLMActorSettings:
        if self.engine_backend == "openai":
            return self.llm.settings()
        if self.vllm_actor is None:
            raise dg.Failure("engine_backend is vllm_actor but the council has no vllm_actor config")
        return self.vllm_actor.settings()

    def dispatcher(self, deadline: float | None) -> RayTurnDispatcher:
        return RayTurnDispatcher(
            self.engine_settings(),
            DispatchSettings(
                num_cpus_per_turn=self.num_cpus_per_turn, max_worker_retries=self.max_worker_retries
            ),
            deadline=deadline,
        )
