"""`EvaluationConfig`: the evaluation asset's run config. Which problems, and the run's settings,
whose fields are derived from `EvaluationSettings` (defaults, bounds and descriptions declared
once, there); the sandbox limits and scoring weights come from the council resource."""

# No `from __future__ import annotations`: Dagster reads the config's annotations at import.
from typing import TYPE_CHECKING, cast

import dagster as dg
from pydantic import Field

from ..domain.limits import SandboxLimits
from ..domain.scoring import ScoringWeights
from ..resources.config import derived_model
from .settings import FROM_THE_COUNCIL, EvaluationSettings

if TYPE_CHECKING:
    from .arms import Problem
    from .suites import Split, Suite


class EvaluationChoice(dg.Config):
    """Which problems an evaluation runs, and how it is run and reported."""

    suite: str = Field(
        default="humaneval",
        description="Benchmark suite: humaneval, fleet or repos, or several comma-separated.",
    )
    split: str = Field(default="dev", description="dev (HumanEval 0-39, for tuning), test (the rest) or all.")
    sample_size: int = Field(default=10, description="Problems drawn from the split (0: all of it).")
    seed: int = Field(default=0, description="Seed of the sample: the same seed gives the same problems.")
    problem_ids: list[str] = Field(
        default_factory=list, description="Explicit problems (e.g. HumanEval/0); overrides the sample."
    )
    max_concurrent_problems: int = Field(default=2, description="Problems evaluated at once on Ray.")
    bootstrap_resamples: int = Field(default=10_000, description="Bootstrap resamples over problems.")
    drop_tolerance: float = Field(
        default=0.05, description="The check flags a pass@1 fall larger than this (absolute)."
    )

    def run_settings(self, sandbox: SandboxLimits, weights: ScoringWeights) -> EvaluationSettings:
        """How every arm samples, with the council's sandbox limits and scoring weights."""
        own = self.model_dump(include=EvaluationSettings.model_fields.keys() - set(FROM_THE_COUNCIL))
        return EvaluationSettings(**own, sandbox=sandbox, weights=weights)

    def problems(self) -> "tuple[Suite, list[Problem]]":
        """The suite and the problems it draws (explicit ids, or the seeded sample of the split)."""
        from .suites import get_suite, sample_problems

        suite = get_suite(self.suite)
        if self.split not in ("dev", "test", "all"):
            raise dg.Failure(description=f"split must be dev, test or all, not {self.split!r}")
        problems = sample_problems(
            suite, cast("Split", self.split), self.sample_size, self.seed, self.problem_ids
        )
        if not problems:
            raise dg.Failure(description=f"no problems in {self.suite} split {self.split}")
        return suite, problems


EvaluationConfig = derived_model(
    EvaluationSettings, "EvaluationConfig", EvaluationChoice, exclude=FROM_THE_COUNCIL
)
EvaluationConfig.__doc__ = "Which problems, and how each arm samples. Defaults: 10 dev problems, N=3, R=1."
