"""Resources for the engine and the council that calls it through Ray."""

from __future__ import annotations

import dagster as dg
from pydantic import Field, SecretStr

from ..dispatch.ray_dispatch import DispatchSettings, RayTurnDispatcher
from ..domain.council import CouncilSettings
from ..domain.scoring import ScoringWeights
from ..llm.engine import EngineSettings


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


class CouncilResource(dg.ConfigurableResource):
    """How councils sample, how their turns are dispatched to Ray, and how proposals are scored."""

    llm: LLMEngineResource = Field(description="The engine every agent turn calls.")
    temperature: float = Field(default=0.7, description="Baseline temperature; diversity agents use x1.3.")
    max_tokens: int = Field(default=2048, description="Completion token limit of one turn.")
    num_cpus_per_turn: float = Field(
        default=0.05, description="Ray CPUs reserved per turn; turns are I/O-bound, so a small fraction."
    )
    max_worker_retries: int = Field(default=3, description="Ray re-runs of a turn whose worker process died.")
    weight_code_present: float = Field(default=0.15, description="Scoring weight: code blocks present.")
    weight_code_parses: float = Field(default=0.40, description="Scoring weight: code blocks parse.")
    weight_requirement_coverage: float = Field(default=0.30, description="Scoring weight: requirements met.")
    weight_sections: float = Field(default=0.15, description="Scoring weight: requested sections present.")

    def council_settings(self) -> CouncilSettings:
        return CouncilSettings(temperature=self.temperature, max_tokens=self.max_tokens)

    def scoring_weights(self) -> ScoringWeights:
        return ScoringWeights(
            code_present=self.weight_code_present,
            code_parses=self.weight_code_parses,
            requirement_coverage=self.weight_requirement_coverage,
            sections=self.weight_sections,
        )

    def dispatcher(self, deadline: float | None) -> RayTurnDispatcher:
        return RayTurnDispatcher(
            self.llm.settings(),
            DispatchSettings(
                num_cpus_per_turn=self.num_cpus_per_turn, max_worker_retries=self.max_worker_retries
            ),
            deadline=deadline,
        )
