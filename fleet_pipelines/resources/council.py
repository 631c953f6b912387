"""The `council` resource: how councils sample, how proposals are scored, and the quorum; and the
councils file (`FLEET_COUNCILS_FILE`) that sets them per role.

Its sampling fields are those of the domain's `CouncilSettings` (derived, never copied: see
resources/config.py), so the UI's config and the code cannot disagree.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field

from ..domain.councils import (
    Convened,
    CouncilSettings,
    CouncilsFile,
    CouncilsFileError,
    convene,
    parse_councils,
)
from ..domain.models import Role, Task
from ..names import TAG_ENGINE
from .config import SandboxLimitsConfig, ScoringWeightsConfig, derived_model


def read_councils(path: str) -> CouncilsFile:
    """The councils file at `path`; raises CouncilsFileError naming the file and every bad field."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CouncilsFileError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    return parse_councils(text, source=path)


# Dagster config has no tuples: `stop` is a list in config, CouncilSettings takes it as a tuple.
_CouncilSettingsFields = derived_model(
    CouncilSettings,
    "CouncilSettingsFields",
    dg.ConfigurableResource,
    overrides={
        "stop": (list[str], Field(default_factory=list, description="Stop sequences of every agent turn."))
    },
)


class CouncilResource(_CouncilSettingsFields):
    """Sampling of the council's turns (the fields of `CouncilSettings`), the scoring of final
    proposals, and the quorum; a councils file, when given, sets them per role."""

    judge_max_tokens: int = Field(
        default=160,
        ge=16,
        le=4_096,
        description="Completion token limit of a judge turn (a JSON verdict, schema-constrained).",
    )
    weights: ScoringWeightsConfig = Field(
        default_factory=ScoringWeightsConfig,
        description="Scoring weights; only the checks that apply to a proposal are averaged.",
    )
    sandbox: SandboxLimitsConfig = Field(
        default_factory=SandboxLimitsConfig, description="Limits of one sandboxed test run."
    )
    quorum: int | None = Field(
        default=None,
        description="Agents with a final proposal needed for a decision; default a majority of the council.",
    )
    councils_file: str | None = Field(
        default=None,
        description="YAML councils file (FLEET_COUNCILS_FILE): per role the agents, engine and model, "
        "token budgets, default rubric and score weights over the values above.",
    )

    def council_settings(self) -> CouncilSettings:
        return CouncilSettings(**{name: getattr(self, name) for name in CouncilSettings.model_fields})

    def councils(self) -> CouncilsFile | None:
        """The councils file (None without one); raises CouncilsFileError naming every bad field."""
        return read_councils(self.councils_file) if self.councils_file else None

    def engine_tags(self, role: str) -> dict[str, str]:
        """The `fleet/engine` run tag of a role the councils file routes to its own engine; none
        for the stack's engine (the job's tag) or an unreadable file (the run reports it)."""
        try:
            councils = self.councils()
            engine = councils.engine(Role(role.upper())) if councils is not None else None
        except (CouncilsFileError, ValueError):
            return {}
        return {TAG_ENGINE: engine.engine_id()} if engine is not None else {}

    def convene(self, task: Task) -> Convened:
        """The council of the task's role: this resource's values (its sandbox limits and quorum
        too), with the councils file's council for the role over them. Only the `council` asset
        calls it: later steps read the convened council. Raises CouncilsFileError for an invalid
        file."""
        return convene(
            task,
            self.council_settings(),
            self.weights.to_model(),
            self.judge_max_tokens,
            self.sandbox.to_model(),
            self.quorum,
            self.councils(),
            self.councils_file,
        )
