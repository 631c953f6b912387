"""Scoring of final proposals by checks that can fail.

Each check returns a value in [0, 1], or None when it does not apply (no requirements given, no
code to parse), and the evidence that led to it. A check that applies but could not run (the
sandbox unavailable: `not_run`) has no value, says so in its evidence, counts 0 in the score and
fails the gate: it never helps. The score is the weighted mean of the checks that apply; a
proposal with no text scores 0. Nothing here is a constant: every value
is read off the proposal.

The checks computed here are pure (code extraction and parsing, requirement coverage, sections).
The checks that need a process or the engine (ruff lint, tests in the sandbox, the LLM judge) run
in `fleet_pipelines.scoring` from the programs, prompts and parsers defined here, and come back
as `CheckResult`s that `score_proposal` weighs with the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import yaml
from pydantic import BaseModel, ConfigDict, Field, create_model

from .models import Message, Role, Task, TurnResult
from .python_ast import parse_module
from .sections import PROPOSAL_SECTIONS

CODE_ROLES = frozenset({Role.DEV, Role.QA, Role.DEVOPS, Role.DATA})
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    "the a an and or of to in on for with by be is are it its as at from that this must should "
    "can will each all any into use using not no have has was were than then also per".split()
)
_LANG_ALIASES = {
    "py": "python",
    "python": "python",
    "python3": "python",
    "json": "json",
    "yaml": "yaml",
    "yml": "yaml",
    "dockerfile": "dockerfile",
    "docker": "dockerfile",
}
DOCKERFILE_INSTRUCTIONS = frozenset(
    "FROM RUN CMD LABEL MAINTAINER EXPOSE ENV ADD COPY ENTRYPOINT VOLUME USER WORKDIR ARG ONBUILD "
    "STOPSIGNAL HEALTHCHECK SHELL".split()
)
TEST_FRAMEWORK_IMPORT = re.compile(r"^\s*(import|from)\s+(pytest|unittest)\b", re.MULTILINE)
JUDGE_MAX_PROPOSAL_CHARS = 6_000
JUDGE_RATIONALE_CHARS = 200
_SECTION_KEYWORDS = {
    PROPOSAL_SECTIONS[0]: ("requirement",),
    PROPOSAL_SECTIONS[1]: ("approach", "solution"),
    PROPOSAL_SECTIONS[2]: ("implementation",),
    PROPOSAL_SECTIONS[3]: ("challenge", "risk", "mitigation"),
}
COVERAGE_THRESHOLD = 0.6


@dataclass(frozen=True)
class Check:
    """One line of `CHECKS`: a check's name (its `CheckResult.name`), its default weight, whether
    it gates the winner (`gate_failures`) and what it measures (the weight's description)."""

    name: str
    weight: float
    gates: bool
    measures: str


class UnknownCheck(LookupError):
    """A check named that is no line of the table."""


# Every scoring check, once. The weights (`ScoringWeights`, the councils file, the UI's config)
# and the gate (`GATE_CHECKS`, in table order) are derived from it; a module that produces a
# check names it with `check_named`, so a name the table lacks fails at import.
CHECKS: tuple[Check, ...] = (
    Check("code_present", 0.05, False, "Fenced code blocks present."),
    Check("code_parses", 0.20, True, "Share of checkable blocks that parse."),
    Check("lint", 0.10, False, "ruff on the extracted Python: 1 - 0.2 per issue."),
    Check(
        "runs",
        0.15,
        True,
        "The code can run: no undefined names or redefinitions, and it imports in the sandbox.",
    ),
    Check(
        "patch_applies",
        0.10,
        True,
        "A repository task's patch applies (`git apply --check`) to its commit.",
    ),
    Check("tests", 0.35, True, "Share of the task's tests passed in the sandbox."),
    Check("requirement_coverage", 0.15, False, "Share of requirements met."),
    Check("sections", 0.05, False, "Share of requested sections addressed."),
    Check("judge", 0.10, False, "LLM judge's rubric score / 10."),
    Check(
        "patch_scope",
        0.10,
        False,
        "A repository task's patch leaves alone what judges it: tests, conftest.py, pytest "
        "configuration, plugin entry points, standard-library names (0 when it touches any).",
    ),
)


def check_named(name: str, checks: Sequence[Check] = CHECKS) -> str:
    """`name`, a line of the table; `UnknownCheck` otherwise (at import, where a module names
    the checks it produces)."""
    if not any(c.name == name for c in checks):
        raise UnknownCheck(f"no scoring check {name!r} in the table (domain/scoring.py CHECKS)")
    return name


def weights_model(checks: Sequence[Check] = CHECKS) -> type[BaseModel]:
    """The weights' model: one field per check, its default weight and what it measures."""
    names = [c.name for c in checks]
    if duplicated := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"scoring checks named twice: {duplicated}")
    return create_model(
        "ScoringWeights",
        __config__=ConfigDict(frozen=True),
        __doc__="Relative weights of the checks; only the checks that apply to a proposal are "
        "averaged, so a check that does not apply (no tests given, no Python code) neither helps "
        "nor hurts.",
        __module__=__name__,
        **{c.name: (float, Field(default=c.weight, ge=0, description=c.measures)) for c in checks},
    )


def gates_of(checks: Sequence[Check] = CHECKS) -> tuple[str, ...]:
    """The checks that gate the winner, in table order (`gate_failures` reports them so)."""
    return tuple(c.name for c in checks if c.gates)


ScoringWeights = weights_model()
GATE_CHECKS = gates_of()
CODE_PRESENT, CODE_PARSES, REQUIREMENT_COVERAGE, SECTIONS = (
    check_named(n) for n in ("code_present", "code_parses", "requirement_coverage", "sections")
)


class CodeBlock(BaseModel):
    language: str
    code: str


class CheckResult(BaseModel):
    name: str
    value: float | None  # None: the check does not apply to this proposal, or could not run
    evidence: str  # the reason, in words
    not_run: bool = False  # it applies but could not run (no sandbox): counts 0, fails the gate
    ran: str = ""  # what was run (command, program, prompt), when something was run
    output: str = ""  # an excerpt of what it printed or replied
    forgeable: bool = False  # its value came from the code it judges: it never passes the gate


class RequirementVerdict(BaseModel):
    requirement: str
    met: bool
    matched_fraction: float
    quote: str


class ProposalScore(BaseModel):
    agent_id: str
    score: float
    checks: list[CheckResult]
    requirements: list[RequirementVerdict]
    code_blocks: int

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def value(self, name: str) -> float | None:
        check = self.check(name)
        return check.value if check else None

    def not_run(self) -> list[str]:
        """The checks that applied but could not run, each with why."""
        return [f"{c.name} not run: {c.evidence}" for c in self.checks if c.not_run]


def gate_failures(score: ProposalScore, gates: Sequence[str] = GATE_CHECKS) -> list[str]:
    """Why a proposal does not pass its hard checks: code that must parse, run and pass its tests.
    A check that could not run (tests not run: no isolation) is a failure here, not a pass, and so
    is one whose result the judged code could have written (`forgeable`)."""
    failures = []
    for name in gates:
        check = score.check(name)
        if check is None:
            continue
        if check.not_run:
            failures.append(f"{name} not run: {check.evidence}")
        elif check.forgeable:
            failures.append(f"{name} forgeable (ran in the process of the code it judges): {check.evidence}")
        elif check.value is None and check.ran:
            failures.append(f"{name}: {check.evidence}")
        elif check.value is not None and check.value < 1.0:
            failures.append(f"{name} = {check.value:.2f}: {check.evidence}")
    return failures


def extract_code_blocks(text: str) -> list[CodeBlock]:
    blocks = []
    for match in _FENCE.finditer(text):
        code = match.group(2)
        if code.strip():
            blocks.append(CodeBlock(language=match.group(1).lower(), code=code))
    return blocks


def parse_block(block: CodeBlock) -> tuple[bool | None, str]:
    """Parses a block in a language we can check; None when the language is not checkable."""
    language = _LANG_ALIASES.get(block.language)
    try:
        if language == "python":
            parse_module(block.code)
        elif language == "json":
            json.loads(block.code)
        elif language == "yaml":
            yaml.safe_load(block.code)
        elif language == "dockerfile":
            return parse_dockerfile(block.code)
        else:
            return None, f"{block.language or 'untagged'} block not checked"
    except SyntaxError as exc:
        return False, f"python: SyntaxError line {exc.lineno}: {exc.msg}"
    except json.JSONDecodeError as exc:
        return False, f"json: {exc.msg} at line {exc.lineno}"
    except yaml.YAMLError as exc:
        return False, f"yaml: {str(exc).splitlines()[0]}"
    return True, f"{language}: parses"


def parse_dockerfile(code: str) -> tuple[bool, str]:
    """Every instruction is a known keyword and the first one (after ARGs) is FROM."""
    logical = re.sub(r"\\\n", " ", code)
    instructions = [
        line.split(None, 1)[0].upper()
        for line in logical.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    unknown = [i for i in instructions if i not in DOCKERFILE_INSTRUCTIONS]
    if unknown:
        return False, f"dockerfile: unknown instruction {unknown[0]}"
    first = next((i for i in instructions if i != "ARG"), None)
    if first != "FROM":
        return False, f"dockerfile: first instruction is {first or 'missing'}, not FROM"
    return True, f"dockerfile: {len(instructions)} instructions"


def python_source(blocks: Sequence[CodeBlock]) -> str:
    """The proposal's program: its Python blocks that parse, in order, joined. Blocks that import
    a test framework are the proposal's own tests and are left out (the sandbox has no pytest)."""
    parts = []
    for block in blocks:
        if _LANG_ALIASES.get(block.language) != "python" or TEST_FRAMEWORK_IMPORT.search(block.code):
            continue
        if parse_block(block)[0]:
            parts.append(block.code.rstrip() + "\n")
    return "\n\n".join(parts)


JUDGE_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "rationale": {"type": "string", "maxLength": JUDGE_RATIONALE_CHARS},
    },
    "required": ["score", "rationale"],
    "additionalProperties": False,
}


class JudgeVerdict(BaseModel):
    score: float = Field(ge=0, le=10)
    rationale: str = ""


def judge_messages(task: Task, proposal_text: str) -> list[Message]:
    rubric = task.constraints.rubric or "correctness, completeness, clarity"
    requirements = "\n".join(f"- {r}" for r in task.constraints.requirements) or "- (none given)"
    system = (
        "You are a strict reviewer. Rate how well the proposal solves the task against the rubric "
        "and the requirements, from 0 (useless or wrong) to 10 (correct and complete). Reply with "
        'JSON only: {"score": <integer 0-10>, "rationale": "<one sentence>"}.'
    )
    user = (
        f"Task: {task.description}\n\nRubric: {rubric}\n\nRequirements:\n{requirements}\n\n"
        f"Proposal:\n{proposal_text[:JUDGE_MAX_PROPOSAL_CHARS]}"
    )
    return [Message(role="system", content=system), Message(role="user", content=user)]


def parse_judge_reply(text: str) -> JudgeVerdict | None:
    """The verdict in a judge reply: the whole reply as JSON, else the first {...} in it
    (engines without schema support wrap JSON in prose or fences); None when neither parses."""
    stripped = text.strip()
    candidates = [stripped]
    match = re.search(r"\{.*\}", stripped, re.DOTALL)
    if match:
        candidates.append(match.group(0))
    for candidate in candidates:
        try:
            return JudgeVerdict.model_validate_json(candidate)
        except ValueError:
            continue
    return None


def _keywords(text: str) -> list[str]:
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if len(word) >= 3 and word not in _STOPWORDS:
            seen[word[:6]] = None
    return list(seen)


def requirement_verdicts(requirements: Sequence[str], text: str) -> list[RequirementVerdict]:
    """A requirement is met when most of its content words occur in the proposal.

    The quote is the sentence of the proposal that holds the most of them: the evidence a
    person checks the verdict against.
    """
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
    sentence_keys = [set(_keywords(s)) for s in sentences]
    text_keys = set(_keywords(text))
    verdicts = []
    for requirement in requirements:
        keys = _keywords(requirement)
        if not keys:
            verdicts.append(
                RequirementVerdict(requirement=requirement, met=False, matched_fraction=0.0, quote="")
            )
            continue
        fraction = sum(k in text_keys for k in keys) / len(keys)
        quote = ""
        if sentences:
            best = max(range(len(sentences)), key=lambda i: len(sentence_keys[i].intersection(keys)))
            if sentence_keys[best].intersection(keys):
                quote = sentences[best][:240]
        verdicts.append(
            RequirementVerdict(
                requirement=requirement,
                met=fraction >= COVERAGE_THRESHOLD,
                matched_fraction=round(fraction, 3),
                quote=quote,
            )
        )
    return verdicts


def score_proposal(
    task: Task,
    proposal: TurnResult,
    weights: ScoringWeights,
    tool_checks: Sequence[CheckResult] = (),
) -> ProposalScore:
    """Scores a final proposal from the pure checks plus `tool_checks` (lint, tests, judge)."""
    text = proposal.content if proposal.ok else ""
    blocks = extract_code_blocks(text)
    checks: list[CheckResult] = []

    if task.role in CODE_ROLES:
        checks.append(
            CheckResult(
                name=CODE_PRESENT,
                value=1.0 if blocks else 0.0,
                evidence=f"{len(blocks)} fenced code block(s)",
            )
        )

    parsed = [(block, *parse_block(block)) for block in blocks]
    checkable = [(b, ok, why) for b, ok, why in parsed if ok is not None]
    checks.append(
        CheckResult(
            name=CODE_PARSES,
            value=(sum(ok for _, ok, _ in checkable) / len(checkable)) if checkable else None,
            evidence="; ".join(why for _, _, why in parsed) or "no code blocks",
        )
    )

    verdicts = requirement_verdicts(task.constraints.requirements, text)
    met = sum(v.met for v in verdicts)
    checks.append(
        CheckResult(
            name=REQUIREMENT_COVERAGE,
            value=(met / len(verdicts)) if verdicts else None,
            evidence=f"{met}/{len(verdicts)} requirements met" if verdicts else "no requirements given",
        )
    )

    lowered = text.lower()
    found = [s for s, keys in _SECTION_KEYWORDS.items() if any(k in lowered for k in keys)]
    checks.append(
        CheckResult(
            name=SECTIONS,
            value=len(found) / len(_SECTION_KEYWORDS),
            evidence=f"sections addressed: {', '.join(found) or 'none'}",
        )
    )
    checks.extend(tool_checks)

    applicable = [
        (getattr(weights, c.name), 0.0 if c.not_run else c.value)
        for c in checks
        if c.value is not None or c.not_run
    ]
    total_weight = sum(w for w, _ in applicable)
    score = sum(w * v for w, v in applicable) / total_weight if text and total_weight else 0.0
    return ProposalScore(
        agent_id=proposal.agent_id,
        score=round(score, 4),
        checks=checks,
        requirements=verdicts,
        code_blocks=len(blocks),
    )
