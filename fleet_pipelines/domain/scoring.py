"""Scoring of final proposals by checks that can fail.

Each check returns a value in [0, 1], or None when it does not apply (no requirements given, no
code to parse), and the evidence that led to it. The score is the weighted mean of the checks
that apply; a proposal with no text scores 0. Nothing here is a constant: every value is read
off the proposal.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field

from .models import Role, Task, TurnResult
from .prompts import PROPOSAL_SECTIONS

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
}
_SECTION_KEYWORDS = {
    PROPOSAL_SECTIONS[0]: ("requirement",),
    PROPOSAL_SECTIONS[1]: ("approach", "solution"),
    PROPOSAL_SECTIONS[2]: ("implementation",),
    PROPOSAL_SECTIONS[3]: ("challenge", "risk", "mitigation"),
}
COVERAGE_THRESHOLD = 0.6


class ScoringWeights(BaseModel):
    """Relative weights of the checks; only the checks that apply to a proposal are averaged."""

    model_config = ConfigDict(frozen=True)

    code_present: float = Field(default=0.15, ge=0)
    code_parses: float = Field(default=0.40, ge=0)
    requirement_coverage: float = Field(default=0.30, ge=0)
    sections: float = Field(default=0.15, ge=0)


class CodeBlock(BaseModel):
    language: str
    code: str


class CheckResult(BaseModel):
    name: str
    value: float | None  # None: the check does not apply to this proposal
    evidence: str


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
            ast.parse(block.code)
        elif language == "json":
            json.loads(block.code)
        elif language == "yaml":
            yaml.safe_load(block.code)
        else:
            return None, f"{block.language or 'untagged'} block not checked"
    except SyntaxError as exc:
        return False, f"python: SyntaxError line {exc.lineno}: {exc.msg}"
    except json.JSONDecodeError as exc:
        return False, f"json: {exc.msg} at line {exc.lineno}"
    except yaml.YAMLError as exc:
        return False, f"yaml: {str(exc).splitlines()[0]}"
    return True, f"{language}: parses"


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


def score_proposal(task: Task, proposal: TurnResult, weights: ScoringWeights) -> ProposalScore:
    text = proposal.content if proposal.ok else ""
    blocks = extract_code_blocks(text)
    checks: list[CheckResult] = []

    if task.role in CODE_ROLES:
        checks.append(
            CheckResult(
                name="code_present",
                value=1.0 if blocks else 0.0,
                evidence=f"{len(blocks)} fenced code block(s)",
            )
        )

    parsed = [(block, *parse_block(block)) for block in blocks]
    checkable = [(b, ok, why) for b, ok, why in parsed if ok is not None]
    checks.append(
        CheckResult(
            name="code_parses",
            value=(sum(ok for _, ok, _ in checkable) / len(checkable)) if checkable else None,
            evidence="; ".join(why for _, _, why in parsed) or "no code blocks",
        )
    )

    verdicts = requirement_verdicts(task.constraints.requirements, text)
    met = sum(v.met for v in verdicts)
    checks.append(
        CheckResult(
            name="requirement_coverage",
            value=(met / len(verdicts)) if verdicts else None,
            evidence=f"{met}/{len(verdicts)} requirements met" if verdicts else "no requirements given",
        )
    )

    lowered = text.lower()
    found = [s for s, keys in _SECTION_KEYWORDS.items() if any(k in lowered for k in keys)]
    checks.append(
        CheckResult(
            name="sections",
            value=len(found) / len(_SECTION_KEYWORDS),
            evidence=f"sections addressed: {', '.join(found) or 'none'}",
        )
    )

    applicable = [(getattr(weights, c.name), c.value) for c in checks if c.value is not None]
    total_weight = sum(w for w, _ in applicable)
    score = sum(w * v for w, v in applicable) / total_weight if text and total_weight else 0.0
    return ProposalScore(
        agent_id=proposal.agent_id,
        score=round(score, 4),
        checks=checks,
        requirements=verdicts,
        code_blocks=len(blocks),
    )
