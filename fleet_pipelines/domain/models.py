"""Tasks, councils, turns and their results: the vocabulary of a deliberation.

Pure data with validation. Bounds are part of the contract: an event or a launchpad config that
breaks one is rejected with the pydantic message naming the field, never truncated silently.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

TASK_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
MAX_DESCRIPTION_CHARS = 8_000
MAX_RUBRIC_CHARS = 4_000
MAX_REQUIREMENTS = 32
MAX_REQUIREMENT_CHARS = 1_000
MAX_METADATA_ENTRIES = 32
MAX_METADATA_VALUE_CHARS = 1_000
MAX_AGENTS = 10
MAX_ROUNDS = 3
MAX_TEST_CHARS = 20_000
MAX_EXAMPLES = 32
MAX_EXAMPLE_CHARS = 1_000


class Role(StrEnum):
    DEV = "DEV"
    QA = "QA"
    ARCHITECT = "ARCHITECT"
    DEVOPS = "DEVOPS"
    DATA = "DATA"


class DeliberationStatus(StrEnum):
    """Outcome of a deliberation (SEED_REFERENCE statuses plus PARTIAL)."""

    COMPLETED = "COMPLETED"
    PARTIAL = "PARTIAL"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"


class TurnKind(StrEnum):
    PROPOSE = "propose"
    CRITIQUE = "critique"
    REVISE = "revise"
    JUDGE = "judge"  # scoring: the LLM judge rates a final proposal against the rubric


class TurnStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"


TaskId = Annotated[str, StringConstraints(pattern=TASK_ID_PATTERN)]
Requirement = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REQUIREMENT_CHARS)]
MetadataValue = Annotated[str, StringConstraints(max_length=MAX_METADATA_VALUE_CHARS)]
ExampleExpr = Annotated[str, StringConstraints(min_length=1, max_length=MAX_EXAMPLE_CHARS)]


class TaskExample(BaseModel):
    """An input/output example: `call` evaluated against the proposal's code must equal `expected`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call: ExampleExpr = Field(description="A Python expression, e.g. `is_palindrome('A b a')`.")
    expected: ExampleExpr = Field(description="A Python expression for the expected value, e.g. `True`.")


class Constraints(BaseModel):
    """What the proposals are judged against, and how long the council may take."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rubric: str = Field(default="", max_length=MAX_RUBRIC_CHARS)
    requirements: list[Requirement] = Field(default_factory=list, max_length=MAX_REQUIREMENTS)
    metadata: dict[str, MetadataValue] = Field(default_factory=dict, max_length=MAX_METADATA_ENTRIES)
    max_iterations: int | None = Field(default=None, ge=1, le=10)
    timeout_seconds: float = Field(default=300.0, gt=0, le=3_600)
    tests: str = Field(
        default="",
        max_length=MAX_TEST_CHARS,
        description="Python test code run in the sandbox against the proposal's code: top-level "
        "asserts and/or `test_*` functions; the proposal's names are imported from `solution`.",
    )
    examples: list[TaskExample] = Field(default_factory=list, max_length=MAX_EXAMPLES)


class Task(BaseModel):
    """One deliberation: a description, the council's role and size, and its constraints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: TaskId
    description: str = Field(min_length=1, max_length=MAX_DESCRIPTION_CHARS)
    role: Role
    num_agents: int = Field(default=3, ge=1, le=MAX_AGENTS)
    rounds: int = Field(default=1, ge=0, le=MAX_ROUNDS)
    constraints: Constraints = Field(default_factory=Constraints)
    story_id: str | None = Field(default=None, max_length=256)
    plan_id: str | None = Field(default=None, max_length=256)


class AgentSpec(BaseModel):
    """One council member: its id, role and sampling settings."""

    model_config = ConfigDict(frozen=True)

    agent_id: str
    role: Role
    index: int
    temperature: float
    diversity: bool


class Message(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str


class TurnRequest(BaseModel):
    """One call of one agent to the engine."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    agent_id: str
    role: Role
    kind: TurnKind
    round: int
    messages: list[Message]
    temperature: float
    max_tokens: int
    target_agent_id: str | None = None  # for a critique: whose proposal is critiqued
    response_schema: dict | None = None  # JSON schema the reply must follow (engine-enforced)


class TurnResult(BaseModel):
    """What came back from one turn; failed and timed-out turns are results too."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    agent_id: str
    role: Role
    kind: TurnKind
    round: int
    target_agent_id: str | None = None
    status: TurnStatus
    content: str = ""
    model: str = ""
    temperature: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    latency_ms: float = 0.0
    attempts: int = 1
    error: str | None = None
    error_type: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is TurnStatus.COMPLETED and bool(self.content.strip())

    @classmethod
    def unfinished(cls, request: TurnRequest, status: TurnStatus, error: str, error_type: str) -> TurnResult:
        """A result for a turn that produced no text (engine error, deadline, lost worker)."""
        return cls(
            task_id=request.task_id,
            agent_id=request.agent_id,
            role=request.role,
            kind=request.kind,
            round=request.round,
            target_agent_id=request.target_agent_id,
            status=status,
            temperature=request.temperature,
            error=error,
            error_type=error_type,
        )
