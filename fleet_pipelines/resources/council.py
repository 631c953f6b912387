"""The `council` resource: how councils sample, how proposals are scored, and the quorum."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from ..domain.council import DEFAULT_MAX_TOKENS, CouncilSettings
from .config import SandboxLimitsConfig, ScoringWeightsConfig


class CouncilResource(dg.ConfigurableResource):
    """Sampling of the council's turns, the scoring of final proposals, and the quorum."""

    temperature: float = Field(default=0.7, description="Baseline temperature; diversity agents use x1.3.")
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, description="Completion token limit of one turn.")
    judge_max_tokens: int = Field(
        default=160,
        description="Completion token limit of a judge turn (a JSON verdict, schema-constrained).",
    )
    weights: ScoringWeightsConfig = Field(
        default_factory=ScoringWeightsConfig,
        description="Scoring weights; only the checks that apply to a proposal are averaged.",
    )
    sandbox: SandboxLimitsConfig = Field(
        default_factory=SandboxLimitsConfig, description="Limits of one sandboxed test run."
    )
    execution_feedback: bool | None = Field(
        default=None,
        description="Show each author its own code's check results (runs, tests with the first failure, "
        "lint) before it revises. Default: on for roles that write code (DEV, QA, DEVOPS, DATA).",
    )
    quorum: int | None = Field(
        default=None,
        description="Agents with a final proposal needed for a decision; default a majority of the council.",
    )

    def council_settings(self) -> CouncilSettings:
        return CouncilSettings(
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            execution_feedback=self.execution_feedback,
        )
