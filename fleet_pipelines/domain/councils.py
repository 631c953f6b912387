"""Councils as configuration: a YAML file that sets, per role, the agents (their temperatures and
diversity), the engine and model, token budgets, a default rubric and the scoring weights.

    version: "2026-11-26.1"            # shown in the UI with every run that used the file
    engines:
      local: {base_url: "http://127.0.0.1:8080/v1", model: SmolLM2-135M-Instruct}
    councils:
      DEV:
        engine: local
        agents:                        # agent i of a council of N takes entry i (cycled)
          - {temperature: 0.2}
          - {temperature: 0.9, diversity: true}
        budgets: {propose: 512, critique: 192, revise: 512}   # completion limit per turn kind
        judge_max_tokens: 160
        rubric: "Correct, tested, idiomatic."   # when the task gives none
        weights: {tests: 0.5, lint: 0.05}       # the rest keep their defaults
        execution_feedback: true

A council's sampling settings (`CouncilSettings`) and its agents (`build_council`) are here too:
the one module of councils, from the file to the convened council.

Pure: parsing and validation only; an invalid file raises `CouncilsFileError` naming each field.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from .limits import SandboxLimits
from .models import MAX_RUBRIC_CHARS, AgentSpec, Role, Task, TurnKind
from .scoring import CODE_ROLES, ScoringWeights
from .tools import ToolProtocol

DIVERSITY_TEMPERATURE_FACTOR = 1.3
MAX_TEMPERATURE = 2.0


class CouncilSettings(BaseModel):
    """Sampling settings shared by a council: temperature, a token budget per turn kind, stop sequences.

    The default budgets are sized so that the default council (3 agents, 1 round: 3 proposals,
    6 critiques, 3 revisions, 3 judge turns) fits its 300 s deadline on the local CPU engine: at
    most 3 x 256 + 6 x 128 + 3 x 256 = 2,304 tokens before judging (SmolLM2-135M mostly spends its
    whole budget), ~40 s at the ~60 tok/s llama.cpp gives on an idle 2-core machine.
    """

    model_config = ConfigDict(frozen=True)

    temperature: float = Field(default=0.7, ge=0.0, le=MAX_TEMPERATURE)
    propose_max_tokens: int = Field(default=256, ge=16, le=32_768, description="Budget of a proposal.")
    critique_max_tokens: int = Field(default=128, ge=16, le=32_768, description="Budget of a critique.")
    revise_max_tokens: int = Field(default=256, ge=16, le=32_768, description="Budget of a revision.")
    max_tokens: int | None = Field(
        default=None,
        ge=16,
        le=32_768,
        description="One limit for every kind instead of the budgets (FLEET_MAX_TOKENS, a councils file).",
    )
    stop: tuple[str, ...] = Field(default=(), description="Stop sequences of every agent turn.")
    execution_feedback: bool | None = Field(
        default=None,
        description="Show each author its own code's check results (runs, tests, lint) before it "
        "revises; None: on for roles that write code.",
    )

    def budget(self, kind: TurnKind) -> int:
        """The completion limit of a turn of this kind (judge turns have their own, in scoring)."""
        budget = {
            TurnKind.PROPOSE: self.propose_max_tokens,
            TurnKind.CRITIQUE: self.critique_max_tokens,
            TurnKind.REVISE: self.revise_max_tokens,
        }[kind]
        return self.max_tokens or budget

    def feedback_for(self, role: Role) -> bool:
        """Whether authors of this role see their own code's check results before revising."""
        return role in CODE_ROLES if self.execution_feedback is None else self.execution_feedback


def agent_id(role: Role, index: int) -> str:
    return f"agent-{role.value.lower()}-{index:03d}"


def build_council(role: Role, num_agents: int, settings: CouncilSettings) -> list[AgentSpec]:
    """Agent 001 is the baseline; the others sample hotter and are told to take another path."""
    agents = []
    for index in range(1, num_agents + 1):
        diversity = index > 1
        temperature = settings.temperature
        if diversity:
            temperature = min(MAX_TEMPERATURE, round(temperature * DIVERSITY_TEMPERATURE_FACTOR, 3))
        agents.append(
            AgentSpec(
                agent_id=agent_id(role, index),
                role=role,
                index=index,
                temperature=temperature,
                diversity=diversity,
            )
        )
    return agents


AGENT_TURN_KINDS = (TurnKind.PROPOSE, TurnKind.CRITIQUE, TurnKind.REVISE)

EngineName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class FileWeights(ScoringWeights):
    """Scoring weights as the file gives them: a check it does not name keeps its default; a name
    that is no check is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class CouncilsFileError(ValueError):
    """The councils file is unreadable or invalid; the message names every invalid field."""


class EngineEntry(BaseModel):
    """An OpenAI-compatible engine a council's turns go to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(
        min_length=1, description="The engine's OpenAI-compatible URL (`/v1` added if missing)."
    )
    model: str = Field(min_length=1, description="Model name sent with each request.")
    slots: int | None = Field(
        default=None,
        ge=1,
        description="Requests this engine serves at once; default its llama.cpp /props, else 4.",
    )
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
        description="Environment variable holding this engine's API key (the key never sits in the file).",
    )
    tool_protocol: ToolProtocol | None = Field(
        default=None,
        description="How agents call tools on this engine (json, openai, text); default the stack engine's.",
    )

    def engine_id(self) -> str:
        """The engine as a run tag value (`fleet/engine`): its host:port."""
        return engine_id(self.base_url)


def engine_id(base_url: str) -> str:
    """An OpenAI-compatible engine's identity for the run queue: host:port of its URL."""
    return urlparse(base_url).netloc or base_url


class AgentProfile(BaseModel):
    """How one agent of the council samples."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(ge=0.0, le=MAX_TEMPERATURE, description="Sampling temperature.")
    diversity: bool = Field(
        default=False, description="Told to take a path other agents are unlikely to take."
    )


class TurnBudgets(BaseModel):
    """Completion limits per turn kind (the council settings' `*_max_tokens`); unnamed kinds keep theirs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    propose: int | None = Field(default=None, ge=16, le=32_768, description="A proposal turn.")
    critique: int | None = Field(default=None, ge=16, le=32_768, description="A critique turn.")
    revise: int | None = Field(default=None, ge=16, le=32_768, description="A revision turn.")


class RoleCouncil(BaseModel):
    """The council of one role."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineName | None = Field(
        default=None, description="Name of an entry of `engines`; default the stack's engine."
    )
    agents: list[AgentProfile] = Field(
        default_factory=list, max_length=10, description="Agent i takes entry i, cycled."
    )
    budgets: TurnBudgets | None = Field(default=None, description="Completion limits per turn kind.")
    max_tokens: int | None = Field(
        default=None, ge=16, le=32_768, description="One completion limit for every kind instead of budgets."
    )
    judge_max_tokens: int | None = Field(
        default=None, ge=16, le=4_096, description="Completion limit of a judge turn."
    )
    rubric: str = Field(
        default="", max_length=MAX_RUBRIC_CHARS, description="Rubric when the task gives none."
    )
    weights: FileWeights = Field(
        default_factory=FileWeights, description="Scoring weights (unnamed keep defaults)."
    )
    execution_feedback: bool | None = Field(
        default=None, description="Authors see their code's checks before revising."
    )

    def settings(self, base: CouncilSettings) -> CouncilSettings:
        """The council settings of this role over the stack's `base`."""
        update = (
            {"execution_feedback": self.execution_feedback} if self.execution_feedback is not None else {}
        )
        if self.budgets is not None:  # the file's budgets apply: only its own max_tokens overrides them
            given = self.budgets.model_dump(exclude_none=True)
            update.update({f"{kind}_max_tokens": tokens for kind, tokens in given.items()})
            update["max_tokens"] = self.max_tokens
        elif self.max_tokens is not None:
            update["max_tokens"] = self.max_tokens
        return base.model_copy(update=update)

    def given(self) -> list[str]:
        """The values the file sets for this role, by name (`budgets.propose`, `weights.tests`)."""
        given = []
        for name in sorted(self.model_fields_set):
            value = getattr(self, name)
            nested = value.model_fields_set if isinstance(value, BaseModel) else ()
            given += [f"{name}.{field}" for field in sorted(nested)] or [name]
        return given

    def shape(self, agents: list[AgentSpec]) -> list[AgentSpec]:
        """The council with this role's agent profiles applied (agent i takes profile i, cycled)."""
        if not self.agents:
            return agents
        return [
            agent.model_copy(update=self.agents[i % len(self.agents)].model_dump())
            for i, agent in enumerate(agents)
        ]


class CouncilsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    version: str = Field(min_length=1, max_length=64, description="The file's version, shown with every run.")
    engines: dict[EngineName, EngineEntry] = Field(default_factory=dict)
    councils: dict[Role, RoleCouncil] = Field(default_factory=dict)

    def unknown_engines(self) -> list[str]:
        return [
            f"councils.{role.value}.engine: {council.engine!r} is not an entry of engines "
            f"({', '.join(sorted(self.engines)) or 'none defined'})"
            for role, council in self.councils.items()
            if council.engine is not None and council.engine not in self.engines
        ]

    def council(self, role: Role) -> RoleCouncil:
        return self.councils.get(role, RoleCouncil())

    def engine(self, role: Role) -> EngineEntry | None:
        name = self.council(role).engine
        return self.engines[name] if name else None


class Convened(BaseModel):
    """The council a task gets, decided once per run: the task (with the council's default rubric
    where it gave none), the council's settings and agents, the weights it is scored by, the limits
    of its sandboxed runs, its quorum, the engine its turns go to (None: the stack's) and the
    councils file version that set them. Every step after `council` reads these, not the resource.
    The fields added later have defaults, so councils stored by older runs still load."""

    model_config = ConfigDict(frozen=True)

    task: Task
    settings: CouncilSettings
    agents: list[AgentSpec]
    weights: ScoringWeights
    judge_max_tokens: int = Field(ge=16, description="Completion limit of a judge turn.")
    sandbox: SandboxLimits = Field(
        default_factory=SandboxLimits,
        description="Limits of one sandboxed run (tests and execution feedback of its proposals).",
    )
    quorum: int | None = Field(
        default=None, description="Agents with a final proposal needed for a decision; None: a majority."
    )
    engine: EngineEntry | None = None
    file: str | None = Field(default=None, description="The councils file, None: built-in councils.")
    version: str | None = Field(default=None, description="The councils file's version.")

    @property
    def quorum_size(self) -> int:
        """Agents with a final proposal a decision needs: `quorum` (at most the council), else a
        majority."""
        return min(self.quorum, len(self.agents)) if self.quorum else len(self.agents) // 2 + 1

    def summary(self) -> dict:
        """What the UI and `fleet councils show` print of the council."""
        return {
            "role": self.task.role.value,
            "engine": self.engine.model_dump() if self.engine else "the stack's engine",
            "agents": [
                {"agent_id": a.agent_id, "temperature": a.temperature, "diversity": a.diversity}
                for a in self.agents
            ],
            "budgets": {kind.value: self.settings.budget(kind) for kind in AGENT_TURN_KINDS},
            "judge_max_tokens": self.judge_max_tokens,
            "execution_feedback": self.settings.feedback_for(self.task.role),
            "rubric": self.task.constraints.rubric,
            "weights": self.weights.model_dump(),
            "quorum": self.quorum_size,
            "sandbox": dataclasses.asdict(self.sandbox),
        }


def convene(
    task: Task,
    base: CouncilSettings,
    weights: ScoringWeights,
    judge_max_tokens: int,
    sandbox: SandboxLimits,
    quorum: int | None,
    councils: CouncilsFile | None = None,
    file: str | None = None,
) -> Convened:
    """The council of the task's role: the configured values (`base`, `weights`,
    `judge_max_tokens`, `sandbox`, `quorum`), with what the councils file sets for the role over
    them. A role the file does not name, and every value the file does not give, keeps the
    configured value (the file sets no sandbox limits or quorum)."""
    council = councils.council(task.role) if councils is not None else RoleCouncil()
    settings = council.settings(base)
    if council.rubric and not task.constraints.rubric:
        task = task.model_copy(
            update={"constraints": task.constraints.model_copy(update={"rubric": council.rubric})}
        )
    return Convened(
        task=task,
        settings=settings,
        agents=council.shape(build_council(task.role, task.num_agents, settings)),
        weights=weights.model_copy(
            update=council.weights.model_dump(include=council.weights.model_fields_set)
        ),
        judge_max_tokens=council.judge_max_tokens or judge_max_tokens,
        sandbox=sandbox,
        quorum=quorum,
        engine=councils.engine(task.role) if councils is not None else None,
        file=file,
        version=councils.version if councils is not None else None,
    )


def parse_councils(text: str, source: str = "councils file") -> CouncilsFile:
    """The councils file from its YAML text; raises CouncilsFileError naming every invalid field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CouncilsFileError(f"{source}: not YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise CouncilsFileError(f"{source}: expected a mapping with version, engines and councils")
    try:
        councils = CouncilsFile.model_validate(data)
    except ValidationError as exc:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'] if p != '[key]') or 'file'}: {err['msg']}"
            for err in exc.errors()
        )
        raise CouncilsFileError(f"{source}: {fields}") from exc
    if unknown := councils.unknown_engines():
        raise CouncilsFileError(f"{source}: {'; '.join(unknown)}")
    return councils
