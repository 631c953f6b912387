"""The `council` resource: how councils sample, how proposals are scored, and the quorum; and the
councils file (`FLEET_COUNCILS_FILE`) that sets them per role."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from pydantic import Field

from ..domain.council import CouncilSettings, build_council
from ..domain.councils import CouncilsFile, CouncilsFileError, EngineEntry, parse_councils
from ..domain.models import AgentSpec, Task, TurnKind
from ..domain.scoring import ScoringWeights
from .config import SandboxLimitsConfig, ScoringWeightsConfig
from .repos import ReposConfig

AGENT_TURN_KINDS = (TurnKind.PROPOSE, TurnKind.CRITIQUE, TurnKind.REVISE)


def read_councils(path: str) -> CouncilsFile:
    """The councils file at `path`; raises CouncilsFileError naming the file and every bad field."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CouncilsFileError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    return parse_councils(text, source=path)


@dataclass(frozen=True)
class Convened:
    """The council a task gets: its agents and settings, the engine its turns go to (None: the
    stack's), the scoring it is judged by, and the councils file version that set them."""

    task: Task  # with the council's default rubric where the task gave none
    settings: CouncilSettings
    agents: list[AgentSpec]
    weights: ScoringWeights
    judge_max_tokens: int
    engine: EngineEntry | None
    file: str | None
    version: str | None

    def metadata(self) -> dict[str, dg.RawMetadataValue]:
        """What the UI shows of the council a run used."""
        return {
            "council": dg.MetadataValue.json(
                {
                    "role": self.task.role.value,
                    "engine": self.engine.model_dump() if self.engine else "the stack's engine",
                    "agents": [
                        {"agent_id": a.agent_id, "temperature": a.temperature, "diversity": a.diversity}
                        for a in self.agents
                    ],
                    "budgets": {kind.value: self.settings.budget(kind) for kind in AGENT_TURN_KINDS},
                    "execution_feedback": self.settings.feedback_for(self.task.role),
                    "rubric": self.task.constraints.rubric,
                    "weights": self.weights.model_dump(),
                }
            ),
            "councils_file": self.file or "none",
            "councils_file_version": self.version or "none",
        }


class CouncilResource(dg.ConfigurableResource):
    """Sampling of the council's turns, the scoring of final proposals, and the quorum; a councils
    file, when given, sets them per role."""

    temperature: float = Field(default=0.7, description="Baseline temperature; diversity agents use x1.3.")
    propose_max_tokens: int = Field(default=256, description="Token budget of a proposal turn.")
    critique_max_tokens: int = Field(default=128, description="Token budget of a critique turn.")
    revise_max_tokens: int = Field(default=256, description="Token budget of a revision turn.")
    max_tokens: int | None = Field(
        default=None,
        description="One limit for proposal, critique and revision turns instead of their budgets "
        "(FLEET_MAX_TOKENS).",
    )
    stop_sequences: list[str] = Field(
        default_factory=list,
        description="Stop sequences of every agent turn (the engine ends the reply there).",
    )
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
    repos: ReposConfig = Field(
        default_factory=ReposConfig,
        description="Repository tasks: workspaces, their caps and run limits, where winning patches "
        "are pushed.",
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
    councils_file: str | None = Field(
        default=None,
        description="YAML councils file (FLEET_COUNCILS_FILE): per role the agents, engine and model, "
        "token budgets, default rubric and score weights over the values above.",
    )

    def council_settings(self) -> CouncilSettings:
        return CouncilSettings(
            temperature=self.temperature,
            propose_max_tokens=self.propose_max_tokens,
            critique_max_tokens=self.critique_max_tokens,
            revise_max_tokens=self.revise_max_tokens,
            max_tokens=self.max_tokens,
            stop=tuple(self.stop_sequences),
            execution_feedback=self.execution_feedback,
        )

    def convene(self, task: Task) -> Convened:
        """The council of the task's role: this resource's values, with the councils file's council
        for the role over them. An invalid file fails the step naming the field."""
        base = self.council_settings()
        if not self.councils_file:
            return Convened(
                task=task,
                settings=base,
                agents=build_council(task.role, task.num_agents, base),
                weights=self.weights.to_model(),
                judge_max_tokens=self.judge_max_tokens,
                engine=None,
                file=None,
                version=None,
            )
        try:
            councils = read_councils(self.councils_file)
        except CouncilsFileError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from exc
        council = councils.council(task.role)
        settings = council.settings(base)
        if council.rubric and not task.constraints.rubric:
            task = task.model_copy(
                update={"constraints": task.constraints.model_copy(update={"rubric": council.rubric})}
            )
        return Convened(
            task=task,
            settings=settings,
            agents=council.shape(build_council(task.role, task.num_agents, settings)),
            weights=council.weights,
            judge_max_tokens=council.judge_max_tokens or self.judge_max_tokens,
            engine=councils.engine(task.role),
            file=self.councils_file,
            version=councils.version,
        )
