"""How an evaluation samples and judges: one declaration of each field, with its default, bounds
and description. The runner runs with `EvaluationSettings`; the asset's `EvaluationConfig`
(evaluation/config.py) is derived from it, so the two cannot disagree."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..domain.limits import SandboxLimits
from ..domain.scoring import ScoringWeights

FROM_THE_COUNCIL = ("sandbox", "weights")
"""The fields the evaluation takes from the council resource, not from its own config."""


class EvaluationSettings(BaseModel):
    """How every arm samples and how candidates are judged; the same for all problems of a run."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    num_agents: int = Field(default=3, ge=2, le=10, description="N: council size and proposals of arm C.")
    rounds: int = Field(default=1, ge=0, le=3, description="R: review rounds of arm D.")
    temperature: float = Field(
        default=0.7, ge=0, le=2, description="Council baseline temperature (arms B, C, D)."
    )
    max_tokens: int = Field(default=256, ge=16, description="Completion limit of every turn.")
    max_samples_b: int = Field(default=32, ge=1, description="Cap on arm B's samples per problem.")
    problem_timeout_s: float = Field(
        default=900.0, gt=0, description="Deadline for all turns of one problem."
    )
    sandbox: SandboxLimits = Field(description="Limits of each sandbox run (the council's).")
    weights: ScoringWeights = Field(
        description="Deliberation scoring weights, the selector's tie-break (the council's)."
    )
