"""Tasks, councils, turns and their results: the vocabulary of a deliberation.

Pure data with validation. Bounds are part of the contract: an event or a launchpad config that
breaks one is rejected with the pydantic message naming the field, never truncated silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from .context import StoryContext
from .tools import ToolStep

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
MAX_FAIL_TO_PASS = 200  # test ids a repository task names as failing on its base commit
MAX_EXAMPLES = 32
MAX_EXAMPLE_CHARS = 1_000
MAX_STORY_TITLE_CHARS = 256
MAX_STORY_DESCRIPTION_CHARS = 4_000
MAX_ACCEPTANCE_CRITERIA = 32


class Role(StrEnum):
    DEV = "DEV"
    QA = "QA"
    ARCHITECT = "ARCHITECT"
    DEVOPS = "DEVOPS"
    DATA = "DATA"


class DeliberationStatus(StrEnum):
    """Outcome of a deliberation (the old system's statuses plus PARTIAL)."""

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


def safe_partition_key(key: str) -> str:
    """A task id is a partition key, and partition keys name files of stored asset values: the
    one check that no segment is `.` or `..` (which would name a folder above the partition's)."""
    if any(segment in (".", "..") for segment in key.split("/")):
        raise ValueError(f"{key!r} is not a safe partition key: no segment may be '.' or '..'")
    return key


TaskId = Annotated[str, StringConstraints(pattern=TASK_ID_PATTERN), AfterValidator(safe_partition_key)]
Requirement = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REQUIREMENT_CHARS)]
MetadataValue = Annotated[str, StringConstraints(max_length=MAX_METADATA_VALUE_CHARS)]
ExampleExpr = Annotated[str, StringConstraints(min_length=1, max_length=MAX_EXAMPLE_CHARS)]
TestName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REQUIREMENT_CHARS)]


class TaskExample(BaseModel):
    """An input/output example: `call` evaluated against the proposal's code must equal `expected`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call: ExampleExpr = Field(description="A Python expression, e.g. `is_palindrome('A b a')`.")
    expected: ExampleExpr = Field(description="A Python expression for the expected value, e.g. `True`.")


class Constraints(BaseModel):
    """What the proposals are judged against, and how long the council may take."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rubric: str = Field(
        default="", max_length=MAX_RUBRIC_CHARS, description="What a good proposal looks like."
    )
    requirements: list[Requirement] = Field(
        default_factory=list, max_length=MAX_REQUIREMENTS, description="Requirements each proposal must meet."
    )
    metadata: dict[str, MetadataValue] = Field(
        default_factory=dict, max_length=MAX_METADATA_ENTRIES, description="Extra context shown to agents."
    )
    max_iterations: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="The most review rounds the task allows (the old system's iteration cap): a task "
        "whose `rounds` exceed it is refused, never cut short silently.",
    )
    timeout_seconds: float = Field(
        default=300.0, gt=0, le=3_600, description="Deliberation deadline in seconds, from the run's start."
    )
    tests: str = Field(
        default="",
        max_length=MAX_TEST_CHARS,
        description="Python test code run in the sandbox against the proposal's code: top-level "
        "asserts and/or `test_*` functions; the proposal's names are found in `solution`, except "
        "one named like a builtin (`sorted`), which the tests take `from solution import sorted`.",
    )
    fail_to_pass: list[TestName] = Field(
        default_factory=list,
        max_length=MAX_FAIL_TO_PASS,
        description="Repository tasks: tests of the repository that fail on the base commit and that a "
        "fix must make pass (pytest node ids, or test function names), counted in the score across "
        "the boundary. Failing tests the description names (`tests/test_calc.py::test_add fails`) "
        "count the same way; other base failures neither help nor hurt.",
    )
    examples: list[TaskExample] = Field(
        default_factory=list,
        max_length=MAX_EXAMPLES,
        description="Input/output examples, each {call: Python expression, expected: Python expression}; "
        "an example that calls only builtin names (`sorted([3, 1])`) calls the proposal's function "
        "of that name.",
    )


MAX_REPO_URL_CHARS = 2_000
MAX_COMMAND_CHARS = 1_000
GIT_REF_PATTERN = r"^[A-Za-z0-9._/@{}^~+-]{1,256}$"


def _no_credentials(url: str) -> str:
    """A repository URL never carries a secret: a token comes from the environment (`repos.token_env`)."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0] and scheme.lower() in ("http", "https"):
        raise ValueError(
            "the repository URL must not carry credentials; give a private remote's token in the "
            "environment variable the deployment names (FLEET_GIT_TOKEN by default)"
        )
    return url


def _relative_path(path: str) -> str:
    """A folder inside the repository: relative, without `..`."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or ".." in parts:
        raise ValueError(f"{path!r} must be a folder inside the repository (relative, no '..')")
    return "/".join(parts)


class RepoSpec(BaseModel):
    """The repository a council changes: where it is, which commit, and how its tests run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, AfterValidator(_no_credentials)] = Field(
        min_length=1,
        max_length=MAX_REPO_URL_CHARS,
        description="Any git URL (https://, ssh://, file://) or a local path to a git repository.",
    )
    ref: str = Field(
        default="HEAD",
        pattern=GIT_REF_PATTERN,
        description="Branch, tag or commit; the commit it resolves to is recorded by the workspace.",
    )
    subdir: Annotated[str, AfterValidator(_relative_path)] = Field(
        default="",
        max_length=256,
        description="Where the project lies inside the repository (tests run there); empty: the root.",
    )
    test_command: str = Field(
        default="python -m pytest -q",
        min_length=1,
        max_length=MAX_COMMAND_CHARS,
        description="The repository's test command, an argv (shell-split, no shell features); run "
        "in the sandbox in a copy of the workspace.",
    )
    setup_command: str = Field(
        default="",
        max_length=MAX_COMMAND_CHARS,
        description="Extra pip requirement specifiers installed into the workspace's environment "
        "besides the repository's declared dependencies (the one step that may use the network).",
    )
    submodules: bool = Field(default=False, description="Check out the repository's submodules too.")


class Task(BaseModel):
    """One deliberation: a description, the council's role and size, and its constraints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: TaskId = Field(description="Also the partition key: [A-Za-z0-9._:-]{1,128}.")
    description: str = Field(min_length=1, max_length=MAX_DESCRIPTION_CHARS, description="What to solve.")
    role: Role = Field(description="Council role: DEV, QA, ARCHITECT, DEVOPS or DATA.")
    num_agents: int = Field(
        default=3, ge=1, le=MAX_AGENTS, description=f"Agents in the council (1-{MAX_AGENTS})."
    )
    rounds: int = Field(
        default=1, ge=0, le=MAX_ROUNDS, description=f"Review rounds after the proposals (0-{MAX_ROUNDS})."
    )
    constraints: Constraints = Field(default_factory=Constraints)
    repo: RepoSpec | None = Field(
        default=None,
        description="A repository the council changes: proposals are patches scored by its own tests.",
    )
    story_id: str | None = Field(default=None, max_length=256, description="Story the task belongs to.")
    plan_id: str | None = Field(default=None, max_length=256, description="Plan the task belongs to.")
    story_title: str | None = Field(
        default=None, max_length=MAX_STORY_TITLE_CHARS, description="The story's title (from the plan)."
    )
    story_description: str | None = Field(
        default=None,
        max_length=MAX_STORY_DESCRIPTION_CHARS,
        description="The story's description (from the plan).",
    )
    acceptance_criteria: list[Requirement] = Field(
        default_factory=list,
        max_length=MAX_ACCEPTANCE_CRITERIA,
        description="The story's acceptance criteria (from the plan).",
    )
    context: StoryContext = Field(
        default_factory=StoryContext,
        description="The story's context as the prompts show it: assembled by the `story_context` "
        "asset, never part of a task's flat form.",
    )
    workspace_view: str = Field(
        default="",
        description="A repository task's workspace as the prompts show it (commit, baseline tests, "
        "files): assembled by the `workspace` asset, never part of a task's flat form.",
    )

    @model_validator(mode="after")
    def _rounds_within_cap(self) -> Task:
        cap = self.constraints.max_iterations
        if cap is not None and self.rounds > cap:
            raise ValueError(
                f"rounds {self.rounds} is more than constraints.max_iterations {cap} "
                "(max_iterations caps the review rounds)"
            )
        return self

    @classmethod
    def from_fields(cls, task_id: str, fields: Mapping[str, Any]) -> Task:
        """The task from its flat form (launchpad config, planned task, CLI) or the old system's
        shape (`flat_form`): the one place the constraint fields move under `constraints`. A field
        that is neither a task field nor a constraint is rejected (extra inputs are not
        permitted), never dropped."""
        try:
            fields = flat_form(fields)
        except PydanticCustomError as exc:
            raise ValidationError.from_exception_data(
                cls.__name__, [{"type": exc, "loc": (), "input": dict(fields)}]
            ) from None
        if assembled := [k for k in ASSEMBLED_FIELDS if k in fields]:  # the run assembles them
            raise ValidationError.from_exception_data(
                cls.__name__,
                [{"type": "extra_forbidden", "loc": (k,), "input": fields[k]} for k in assembled],
            )
        constraints = {k: v for k, v in fields.items() if k in CONSTRAINT_FIELDS}
        top = {k: v for k, v in fields.items() if k not in CONSTRAINT_FIELDS}
        return cls.model_validate({"task_id": task_id, **top, "constraints": constraints})

    def fields(self) -> dict[str, Any]:
        """The flat form (JSON values) without the task id: what `from_fields` reads back."""
        flat = self.model_dump(mode="json", exclude={"task_id", *ASSEMBLED_FIELDS})
        return {**flat, **self.constraints.model_dump(mode="json")}


CONSTRAINT_FIELDS = frozenset(Constraints.model_fields)
ASSEMBLED_FIELDS = ("constraints", "context", "workspace_view")  # not fields of the flat form
OLD_CONSTRAINTS = ("rubric", "requirements", "metadata", "max_iterations", "timeout_seconds")
"""What the old system's task carried under `constraints` (its planners still send that shape)."""


def flat_form(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A task's flat form, from itself or from the old system's task shape: `constraints:
    {rubric, requirements[], metadata{}, max_iterations, timeout_seconds}` (any constraint of
    ours is accepted there too) and `task_description` for `description`. Raises
    PydanticCustomError naming a field given twice, or a `constraints` entry that is no
    constraint, so nothing is dropped or overwritten silently."""
    flat = dict(fields)
    if "task_description" in flat:
        if "description" in flat:
            raise PydanticCustomError("task_shape", "task_description and description: give one of them")
        flat["description"] = flat.pop("task_description")
    if "constraints" not in flat:
        return flat
    nested = flat.pop("constraints")
    if nested is None:
        return flat
    if not isinstance(nested, Mapping):
        raise PydanticCustomError(
            "task_shape", "constraints: expected an object, got {kind}", {"kind": type(nested).__name__}
        )
    for key, value in nested.items():
        if key not in CONSTRAINT_FIELDS:
            raise PydanticCustomError(
                "task_shape",
                "constraints.{key}: not a constraint (known: {known})",
                {"key": str(key)[:80], "known": ", ".join(Constraints.model_fields)},
            )
        if key in flat:
            raise PydanticCustomError(
                "task_shape", "constraints.{key} and {key}: give one of them", {"key": key}
            )
        flat[key] = value
    return flat


STORY_FIELDS = ("story_id", "plan_id", "story_title", "story_description", "acceptance_criteria")
"""The plan's fields that every task of the plan shares: a planned task does not give its own."""


def validation_message(exc: ValidationError) -> str:
    """Every invalid field of a task, as `field.path: message`."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'task'}: {err['msg']}" for err in exc.errors()
    )


def flat_task_fields() -> dict[str, tuple[Any, FieldInfo]]:
    """The fields of a task's flat form, with the domain's types, bounds, defaults and descriptions:
    the schema that launchpad config and planned tasks derive from."""
    fields = {
        name: (info.annotation, info)
        for name, info in Task.model_fields.items()
        if name not in ("task_id", *ASSEMBLED_FIELDS)
    }
    fields.update({name: (info.annotation, info) for name, info in Constraints.model_fields.items()})
    return fields


class AgentSpec(BaseModel):
    """One council member: its id, role and sampling settings."""

    model_config = ConfigDict(frozen=True)

    agent_id: str
    role: Role
    index: int
    temperature: float
    diversity: bool


class Message(BaseModel):
    """One chat message. Native tool calling adds an assistant message's `tool_calls` (OpenAI's
    form: id, type, function name and JSON arguments) and the `tool` message answering one."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None

    def wire(self) -> dict:
        """The message as the OpenAI chat API takes it (the unset tool fields left out)."""
        return self.model_dump(exclude_none=True)


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
    stop: list[str] = Field(default_factory=list)  # stop sequences (the engine ends the reply there)
    tools: list[dict] | None = None  # OpenAI `tools` (an engine with tool calling); None: text protocol

    @property
    def conversation(self) -> tuple[str, str]:
        """(task, author) of the proposal conversation this turn starts with: a proposal its own,
        a critique its target's, a revision its author's (domain/prompts.py lays them out so).
        Turns of one conversation share a prompt prefix; the admission queue sends them to the
        engine slot that last held it."""
        return self.task_id, self.target_agent_id or self.agent_id


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
    tokens_cached: int = 0  # of tokens_in, read from the engine's prompt cache (not computed again)
    latency_ms: float = 0.0  # service: from sending to the engine to the last token
    queue_ms: float = 0.0  # admission: waiting for a free engine slot before being sent
    first_token_ms: float = 0.0  # from sending to the first token
    attempts: int = 1  # 0: never sent (it could not start before the deadline)
    error: str | None = None
    error_type: str | None = None
    tool_steps: list[ToolStep] = Field(default_factory=list)  # the turn's tool calls and results, in order
    engine_calls: int = 1  # engine calls of the turn (1 + one per round of tool calls)
    largest_prompt: int = 0  # the largest prompt of those calls, in the engine's tokens
    tool_ms: float = 0.0  # sandbox time of the turn's tool calls

    @property
    def ok(self) -> bool:
        return self.status is TurnStatus.COMPLETED and bool(self.content.strip())

    @classmethod
    def for_request(cls, request: TurnRequest, status: TurnStatus, **fields: Any) -> TurnResult:
        """The result of `request`: its identity and temperature, with `status` and `fields`."""
        return cls(
            task_id=request.task_id,
            agent_id=request.agent_id,
            role=request.role,
            kind=request.kind,
            round=request.round,
            target_agent_id=request.target_agent_id,
            temperature=request.temperature,
            status=status,
            **fields,
        )

    @classmethod
    def unfinished(cls, request: TurnRequest, status: TurnStatus, error: str, error_type: str) -> TurnResult:
        """A result for a turn that produced no text (engine error, deadline, lost worker)."""
        return cls.for_request(request, status, error=error, error_type=error_type, attempts=0)


def turn_label(turn: TurnRequest | TurnResult) -> str:
    """`agent-dev-001 critique r1 -> agent-dev-002`: how progress and logs name a turn."""
    target = f" -> {turn.target_agent_id}" if turn.target_agent_id else ""
    return f"{turn.agent_id} {turn.kind.value} r{turn.round}{target}"
