"""Evaluation of councils on problems with hidden tests: programs, the selector, metrics, statistics.

Pure: no I/O, no frameworks. The runner executes the programs built here in the sandbox and feeds
the outcomes back into the functions below.

Arms, all with the same model and prompt:
  A  one greedy sample (temperature 0) of the baseline agent;
  B  the baseline agent sampled k times at the council temperature, k chosen so B spends about the
     tokens D spent on the same problem, then our selector;
  C  the council's round-0 proposals (no review), then our selector;
  D  the full council (proposals, R review rounds), final versions, then our selector;
  E  the full council again, each author also shown its own code's checks before revising (whether
     it runs, the prompt's worked examples as tests, lint), then our selector.
The selector and E's authors see only what the prompt shows (its worked examples, run against each
candidate) and the deliberation score; the hidden tests decide pass/fail and never reach either.
"""

from __future__ import annotations

import ast
import doctest
import math
import re
from collections.abc import Sequence
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..domain.models import Role, TurnResult
from ..domain.python_ast import parse_expression, parse_module
from ..domain.scoring import extract_code_blocks

_PYTHON_LANGS = frozenset({"", "python", "py", "python3"})


class Arm(StrEnum):
    GREEDY = "A"
    SAMPLED = "B"
    PROPOSALS = "C"
    COUNCIL = "D"
    FEEDBACK = "E"


ARM_LABELS: dict[Arm, str] = {
    Arm.GREEDY: "A greedy single",
    Arm.SAMPLED: "B single x k + selector",
    Arm.PROPOSALS: "C N proposals + selector",
    Arm.COUNCIL: "D council + selector",
    Arm.FEEDBACK: "E council + execution feedback + selector",
}


class Example(BaseModel):
    """A worked example shown in the prompt: an expression and the value the prompt says it has."""

    model_config = ConfigDict(frozen=True)

    call: str
    expected: str


class Problem(BaseModel):
    """A benchmark problem: the prompt an agent sees and the hidden test it is judged by."""

    model_config = ConfigDict(frozen=True)

    suite: str = Field(description="Suite the problem belongs to, e.g. humaneval or fleet.")
    problem_id: str = Field(description="Id within the suite, e.g. HumanEval/0.")
    index: int = Field(description="Position in the suite (HumanEval: 0-163).")
    role: Role = Field(description="Council role that solves it.")
    prompt: str = Field(description="Python stub (imports, signature, docstring) shown to agents.")
    entry_point: str = Field(description="Name of the function the hidden test calls.")
    test: str = Field(description="Hidden test source defining check(candidate); never shown to agents.")
    canonical_solution: str = Field(description="Reference body completing the prompt (harness check).")
    repo_case: str = Field(
        default="",
        description="A repository problem: the generated repository (evaluation.repo_suite); the prompt "
        "is the task, `test` the hidden tests, `canonical_solution` the fixing patch.",
    )


def parse_examples(problem: Problem) -> list[Example]:
    """The worked examples of the prompt: `>>>` doctests and one-line `f(x) == y` / `f(x) ➞ y` forms."""
    examples = []
    for e in doctest.DocTestParser().get_examples(problem.prompt):
        # The docstring's closing quotes often sit right under the expected output.
        want = re.split(r"\"\"\"|\'\'\'", e.want)[0].strip()
        if want:
            examples.append(Example(call=e.source.strip(), expected=want))
    arrow = r"(?:==>|=>|==|➞|->|#\s*returns?|should return)"
    line = re.compile(rf"^\s*({re.escape(problem.entry_point)}\(.*\))\s*{arrow}\s*(.+?)\s*$", re.MULTILINE)
    seen = {e.call for e in examples}
    for call, expected in line.findall(problem.prompt):
        if call not in seen and _is_expression(call):
            seen.add(call)
            expected = expected.rstrip(".")
            # Some prompts write JavaScript-style booleans.
            expected = {"true": "True", "false": "False"}.get(expected, expected)
            examples.append(Example(call=call, expected=expected))
    return examples


def _is_expression(source: str) -> bool:
    try:
        parse_expression(source)
    except SyntaxError:
        return False
    return True


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def candidate_source(problem: Problem, completion: str) -> str | None:
    """The module a completion stands for, or None when it holds no code.

    A fenced Python block defining the entry point wins; otherwise the first Python block (or the
    bare text, when nothing is fenced) is taken as the body that completes the prompt. The prompt
    always comes first, so its imports and helper functions exist; a full definition in the
    completion replaces the stub.
    """
    fenced = extract_code_blocks(completion)
    blocks = [b.code for b in fenced if b.language in _PYTHON_LANGS]
    if not fenced and completion.strip():
        blocks = [completion]
    if not blocks:
        return None
    code = next((b for b in blocks if _defines(b, problem.entry_point)), blocks[0])
    if _defines(code, problem.entry_point):
        return f"{problem.prompt}\n\n{code.strip()}\n"
    lines = code.strip("\n").splitlines()
    if lines and not lines[0].startswith((" ", "\t")):
        lines = [f"    {ln}" if ln.strip() else ln for ln in lines]
    return problem.prompt + "\n".join(lines) + "\n"


def reference_source(problem: Problem) -> str:
    return problem.prompt + problem.canonical_solution


def empty_source(problem: Problem) -> str:
    """The prompt with an empty body: it returns None, and every hidden test must reject it."""
    return problem.prompt + "    pass\n"


def prompt_preamble(problem: Problem) -> str:
    """What every test program of a problem starts with: the prompt's own imports and helpers
    (everything of the prompt but the entry point's definition), then the entry point taken from
    the candidate. The helpers the hidden test calls (`poly`, `encode_cyclic`) are the prompt's,
    never the candidate's redefinitions, and the entry point is the candidate's even where a
    builtin has its name."""
    tree = parse_module(problem.prompt)
    lines = problem.prompt.splitlines(keepends=True)
    for node in reversed(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == problem.entry_point:
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            del lines[start - 1 : node.end_lineno]
    return f"{''.join(lines).rstrip()}\n\nfrom solution import {problem.entry_point}\n"


def hidden_tests(problem: Problem) -> str:
    """Test code for the sandbox's harness (`run_tests`, the candidate as `solution.py`): the
    prompt's preamble (`prompt_preamble`), then the hidden test's `check` called on the entry
    point. The test runs in the harness's test process with pristine builtins, where the
    candidate's entry point is a stub whose results cross as plain data, so nothing the candidate
    does can pass it but right answers."""
    run = f"def test_hidden():\n    check({problem.entry_point})\n"
    return f"{prompt_preamble(problem)}\n{problem.test}\n\n{run}"


def examples_tests(problem: Problem, examples: Sequence[Example]) -> str:
    """Test code with one test per prompt example, for the harness like `hidden_tests` (after the
    same preamble). An example holds when the value equals the expected one evaluated as Python,
    or when its repr equals the expected text (doctest's rule)."""
    tests = [prompt_preamble(problem)]
    for i, example in enumerate(examples):
        tests.append(
            f"def test_example_{i:03d}():\n"
            f"    got = eval({example.call!r})\n"
            "    try:\n"
            f"        ok = got == eval({example.expected!r})\n"
            "    except Exception:\n"
            "        ok = False\n"
            f"    assert ok or repr(got).strip() == {example.expected.strip()!r}\n"
        )
    return "\n\n".join(tests)


def examples_passed(outcomes: Sequence[dict] | None) -> int:
    """How many prompt examples held, from the harness's outcomes of `examples_tests`."""
    return sum(o["passed"] for o in outcomes or [] if o["name"].startswith("test_example_"))


def hidden_status(outcomes: Sequence[dict] | None, complete: bool, run_status: str) -> str:
    """ "passed" only when the harness finished and every outcome of `hidden_tests` passed; else
    the run's status ("timeout", "error") or "failed"."""
    if not complete:
        return run_status if run_status in ("timeout", "error") else "failed"
    return "passed" if outcomes and all(o["passed"] for o in outcomes) else "failed"


class Candidate(BaseModel):
    """One answer an arm may select, with what the selector may see and what the hidden test said."""

    model_config = ConfigDict(frozen=True)

    agent_id: str
    round: int = 0
    has_code: bool = Field(description="A Python source could be read off the completion.")
    examples_passed: int = 0
    examples_total: int = 0
    score: float = Field(default=0.0, description="Deliberation score (domain.scoring).")
    passed: bool = Field(default=False, description="Hidden test verdict; never read by the selector.")
    hidden_status: str = "not_run"


def select(candidates: Sequence[Candidate]) -> int | None:
    """Index of the selected candidate: most prompt examples passed, then the deliberation score,
    then the earliest (the baseline agent first). None when no candidate has code."""
    usable = [i for i, c in enumerate(candidates) if c.has_code]
    if not usable:
        return None
    return min(usable, key=lambda i: (-candidates[i].examples_passed, -candidates[i].score, i))


def budget_prefix(token_costs: Sequence[int], budget: int) -> int:
    """How many samples, taken in order, spend the tokens closest to `budget` (at least one)."""
    if not token_costs:
        return 0
    best, best_gap, spent = 1, math.inf, 0
    for n, cost in enumerate(token_costs, start=1):
        spent += cost
        gap = abs(spent - budget)
        if gap < best_gap:
            best, best_gap = n, gap
    return best


class ArmOutcome(BaseModel):
    """One arm on one problem (`arm_outcome`)."""

    problem_id: str
    arm: Arm
    candidates: list[Candidate]
    selected: int | None
    tokens_in: int
    tokens_out: int
    calls: int
    failed_calls: int
    wall_s: float

    @property
    def passed(self) -> bool:
        return self.selected is not None and self.candidates[self.selected].passed

    @property
    def oracle(self) -> bool:
        return any(c.passed for c in self.candidates)

    @property
    def one_sample(self) -> float:
        """Chance that one candidate drawn at random passes (0 when there is none)."""
        return sum(c.passed for c in self.candidates) / len(self.candidates) if self.candidates else 0.0


class EvaluationProgress:
    """Progress of an evaluation as its problems finish: one line per (problem, arm) with how many
    of all (problem, arm) pairs are done, the arm's verdict and tokens, the passes of every arm so
    far, the tokens spent in all, and the time left at the pace of the problems done."""

    def __init__(self, problems: int, arms: int, started: float):
        self.problems, self.arms, self.started = problems, arms, started
        self.done_problems = 0
        self.outcomes: list[ArmOutcome] = []

    def problem_done(self, outcomes: Sequence[ArmOutcome], now: float) -> list[str]:
        """The lines of one finished problem's arms (`now`: the same clock as `started`)."""
        self.done_problems += 1
        left = self.problems - self.done_problems
        per_problem = (now - self.started) / self.done_problems
        eta = f"~{_duration(left * per_problem)} left at the current pace" if left else "all problems done"
        lines = []
        for outcome in outcomes:
            self.outcomes.append(outcome)
            passes = " ".join(
                f"{arm.value} {sum(o.passed for o in self.outcomes if o.arm is arm)}/{self.done_problems}"
                for arm in Arm
            )
            spent = sum(o.tokens_in + o.tokens_out for o in self.outcomes)
            lines.append(
                f"evaluation {len(self.outcomes)}/{self.problems * self.arms}: {outcome.problem_id} "
                f"arm {outcome.arm.value} {'passed' if outcome.passed else 'failed'} "
                f"({outcome.tokens_in + outcome.tokens_out:,} tokens, {outcome.wall_s:.0f} s); "
                f"passes so far {passes}; {spent:,} tokens in all; {eta}"
            )
        return lines


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    return (
        f"{seconds:.0f} s"
        if seconds < 90
        else f"{minutes:.0f} min"
        if minutes < 90
        else f"{minutes / 60:.1f} h"
    )


def selection_efficiency(selected: float, one_sample: float, oracle: float) -> float | None:
    """(selected - one sample) / (oracle - one sample): 1 when the selector always finds a passing
    candidate that exists, 0 when it does no better than a random pick. None when the oracle gives
    no headroom over one sample (every or no candidate passes), where the ratio is undefined."""
    headroom = oracle - one_sample
    if headroom <= 1e-12:
        return None
    return (selected - one_sample) / headroom


class ArmSummary(BaseModel):
    arm: Arm
    problems: int
    solved: int
    pass_at_1: float
    oracle: float
    one_sample: float
    selection_efficiency: float | None
    tokens_in_per_problem: float
    tokens_out_per_problem: float
    calls_per_problem: float
    wall_s_per_problem: float
    tokens_per_solved: float | None = Field(description="All tokens (in+out) / problems solved.")
    wall_s_per_solved: float | None


def summarize_arm(arm: Arm, outcomes: Sequence[ArmOutcome]) -> ArmSummary:
    rows = [o for o in outcomes if o.arm is arm]
    n = len(rows)
    if n == 0:
        raise ValueError(f"no outcomes for arm {arm}")
    solved = sum(o.passed for o in rows)
    pass_at_1 = solved / n
    oracle = sum(o.oracle for o in rows) / n
    one_sample = sum(o.one_sample for o in rows) / n
    tokens = sum(o.tokens_in + o.tokens_out for o in rows)
    wall = sum(o.wall_s for o in rows)
    return ArmSummary(
        arm=arm,
        problems=n,
        solved=solved,
        pass_at_1=pass_at_1,
        oracle=oracle,
        one_sample=one_sample,
        selection_efficiency=selection_efficiency(pass_at_1, one_sample, oracle),
        tokens_in_per_problem=sum(o.tokens_in for o in rows) / n,
        tokens_out_per_problem=sum(o.tokens_out for o in rows) / n,
        calls_per_problem=sum(o.calls for o in rows) / n,
        wall_s_per_problem=wall / n,
        tokens_per_solved=tokens / solved if solved else None,
        wall_s_per_solved=wall / solved if solved else None,
    )


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs (a binomial test at 1/2)."""
    n = only_first + only_second
    if n == 0:
        return 1.0
    k = min(only_first, only_second)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


class PairedComparison(BaseModel):
    """First arm vs second arm over the same problems."""

    first: Arm
    second: Arm
    problems: int
    both: int
    only_first: int
    only_second: int
    neither: int
    difference: float = Field(description="pass@1(first) - pass@1(second).")
    mcnemar_p: float
    ci_low: float
    ci_high: float
    confidence: float


def paired_comparison(
    first: Arm,
    second: Arm,
    outcomes: Sequence[ArmOutcome],
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedComparison:
    """Exact McNemar test and a percentile bootstrap interval of the pass@1 difference, resampling
    problems (both arms keep their pairing)."""
    a = {o.problem_id: o.passed for o in outcomes if o.arm is first}
    b = {o.problem_id: o.passed for o in outcomes if o.arm is second}
    ids = sorted(a.keys() & b.keys())
    if not ids:
        raise ValueError(f"no problem has both arms {first} and {second}")
    x = np.array([a[i] for i in ids], dtype=float)
    y = np.array([b[i] for i in ids], dtype=float)
    diff = x - y
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(ids), size=(resamples, len(ids)))
    means = diff[draws].mean(axis=1)
    alpha = (1 - confidence) / 2
    only_first = int(((x == 1) & (y == 0)).sum())
    only_second = int(((x == 0) & (y == 1)).sum())
    return PairedComparison(
        first=first,
        second=second,
        problems=len(ids),
        both=int(((x == 1) & (y == 1)).sum()),
        only_first=only_first,
        only_second=only_second,
        neither=int(((x == 0) & (y == 0)).sum()),
        difference=float(diff.mean()),
        mcnemar_p=mcnemar_exact(only_first, only_second),
        ci_low=float(np.quantile(means, alpha)),
        ci_high=float(np.quantile(means, 1 - alpha)),
        confidence=confidence,
    )


class Drop(BaseModel):
    arm: Arm
    previous: float
    current: float


def drops(previous: dict[Arm, float], current: dict[Arm, float], tolerance: float) -> list[Drop]:
    """Arms whose pass@1 fell by more than `tolerance` against the previous evaluation."""
    return [
        Drop(arm=arm, previous=previous[arm], current=current[arm])
        for arm in Arm
        if arm in previous and arm in current and previous[arm] - current[arm] > tolerance + 1e-12
    ]


def arm_outcome(
    problem_id: str, arm: Arm, candidates: list[Candidate], turns: Sequence[TurnResult], wall_s: float
) -> ArmOutcome:
    """What one arm did on a problem: its candidates, the one selected, and what its turns cost."""
    return ArmOutcome(
        problem_id=problem_id,
        arm=arm,
        candidates=candidates,
        selected=select(candidates),
        tokens_in=sum(t.tokens_in for t in turns),
        tokens_out=sum(t.tokens_out for t in turns),
        calls=len(turns),
        failed_calls=sum(not t.ok for t in turns),
        wall_s=round(wall_s, 3),
    )
