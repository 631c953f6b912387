"""Councils: the agents of one role that deliberate on a task."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .models import AgentSpec, Role, TurnKind
from .scoring import CODE_ROLES

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
