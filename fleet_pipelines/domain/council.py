"""Councils: the agents of one role that deliberate on a task."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .models import AgentSpec, Role
from .scoring import CODE_ROLES

DIVERSITY_TEMPERATURE_FACTOR = 1.3
MAX_TEMPERATURE = 2.0
DEFAULT_MAX_TOKENS = 1024  # completion limit of one turn (FLEET_MAX_TOKENS); the seed system used 2048


class CouncilSettings(BaseModel):
    """Sampling settings shared by a council."""

    model_config = ConfigDict(frozen=True)

    temperature: float = Field(default=0.7, ge=0.0, le=MAX_TEMPERATURE)
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=16, le=32_768)
    execution_feedback: bool | None = Field(
        default=None,
        description="Show each author its own code's check results (runs, tests, lint) before it "
        "revises; None: on for roles that write code.",
    )

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
