"""Runs the arms of an evaluation on problems, one Ray task per problem.

A problem task reuses the deliberation code: `proposal_requests` and `review_rounds` build the
turns, `RayTurnDispatcher` runs them as Ray tasks against the engine (nested under the problem
task, so the engine's parallel slots batch turns of several problems). Candidates are judged in
the sandbox's harness (the candidate in its own process, outcomes on a channel it cannot reach):
the prompt's examples (what the selector may use) and the hidden test (the verdict), in separate
runs, so the selector never sees a hidden result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import ray

from ..dispatch.ray_dispatch import AnyEngineSettings, DispatchSettings, RayTurnDispatcher
from ..domain.councils import CouncilSettings, build_council
from ..domain.deliberation import (
    CodeChecker,
    TurnContext,
    TurnRunner,
    current_versions,
    proposal_requests,
    review_rounds,
)
from ..domain.limits import SandboxLimits
from ..domain.models import (
    MAX_EXAMPLES,
    AgentSpec,
    Constraints,
    Task,
    TaskExample,
    TurnRequest,
    TurnResult,
    TurnStatus,
)
from ..domain.scoring import CheckResult, score_proposal
from ..sandbox import run_tests
from ..scoring.code import execution_checks
from ..workspace.runs import RepoRunLimits
from . import arms as ev
from .settings import EvaluationSettings

# Tuned on the development split (HumanEval 0-39) only: asking for the whole function first made
# SmolLM2-135M put a defining code block in 10/10 answers on problems 0-9.
TASK_INSTRUCTION = (
    "Complete this Python function. Reply with the complete function in one fenced python code "
    "block.\n\n```python\n{prompt}```"
)
TASK_RUBRIC = "Correct on every valid input; the examples in the docstring hold."


def problem_task(problem: ev.Problem, settings: EvaluationSettings) -> Task:
    return Task(
        task_id=problem.problem_id.replace("/", ":"),
        description=TASK_INSTRUCTION.format(prompt=problem.prompt),
        role=problem.role,
        num_agents=settings.num_agents,
        rounds=settings.rounds,
        constraints=Constraints(rubric=TASK_RUBRIC, timeout_seconds=settings.problem_timeout_s),
    )


class CandidateJudge:
    """Runs candidates in the sandbox, once per distinct source."""

    def __init__(self, problem: ev.Problem, task: Task, settings: EvaluationSettings):
        self.problem = problem
        self.task = task
        self.settings = settings
        self.examples = ev.parse_examples(problem)
        self._verdicts: dict[str, tuple[int, bool, str]] = {}

    def _run(self, source: str) -> tuple[int, bool, str]:
        held = self._verdicts.get(source)
        if held is None:
            limits = self.settings.sandbox
            examples = 0
            if self.examples:
                shown = run_tests(source, [], ev.examples_tests(self.problem, self.examples), limits)
                examples = ev.examples_passed(shown.outcomes)
            hidden = run_tests(source, [], ev.hidden_tests(self.problem), limits)
            if hidden.result.status == "not_run":
                raise RuntimeError(f"sandbox cannot run hidden tests: {hidden.result.reason}")
            status = ev.hidden_status(hidden.outcomes, hidden.complete, hidden.result.status)
            held = self._verdicts[source] = (examples, status == "passed", status)
        return held

    def candidate(self, turn: TurnResult) -> ev.Candidate:
        source = ev.candidate_source(self.problem, turn.content) if turn.ok else None
        if source is None:
            return ev.Candidate(
                agent_id=turn.agent_id,
                round=turn.round,
                has_code=False,
                examples_total=len(self.examples),
                hidden_status="no_code" if turn.ok else turn.status.value,
            )
        examples, passed, status = self._run(source)
        return ev.Candidate(
            agent_id=turn.agent_id,
            round=turn.round,
            has_code=True,
            examples_passed=examples,
            examples_total=len(self.examples),
            score=score_proposal(self.task, turn, self.settings.weights).score,
            passed=passed,
            hidden_status=status,
        )

    def outcome(
        self, arm: ev.Arm, turns: Sequence[TurnResult], finals: Sequence[TurnResult], wall_s: float
    ) -> ev.ArmOutcome:
        candidates = [self.candidate(t) for t in finals]
        return ev.arm_outcome(self.problem.problem_id, arm, candidates, turns, wall_s)


class Judge(Protocol):
    """What the arms need of a problem's judge (`CandidateJudge`, `repo_problems.RepoJudge`)."""

    def outcome(
        self, arm: ev.Arm, turns: Sequence[TurnResult], finals: Sequence[TurnResult], wall_s: float
    ) -> ev.ArmOutcome: ...


def _tokens(turn: TurnResult) -> int:
    return turn.tokens_in + turn.tokens_out


def _samples(
    task: Task, agent: AgentSpec, settings: CouncilSettings, start: int, count: int
) -> list[TurnRequest]:
    """`count` independent samples of one agent's proposal, told apart by a sample suffix."""
    (request,) = proposal_requests(task, [agent], settings)
    return [
        request.model_copy(update={"agent_id": f"{agent.agent_id}/s{start + j:02d}"}) for j in range(count)
    ]


def feedback_checker(problem: ev.Problem, task: Task, limits: SandboxLimits):
    """Arm E's `CodeChecker`: the deliberation's execution checks with the prompt's worked examples
    as the task's tests (what the prompt already shows; never the hidden test)."""
    examples = [TaskExample(call=e.call, expected=e.expected) for e in ev.parse_examples(problem)]
    shown = task.model_copy(
        update={"constraints": task.constraints.model_copy(update={"examples": examples[:MAX_EXAMPLES]})}
    )

    def check_code(_task: Task, text: str) -> list[CheckResult]:
        return execution_checks(shown, text, limits)

    return check_code


def evaluate_problem(
    problem: ev.Problem, settings: EvaluationSettings, engine: AnyEngineSettings, dispatch: DispatchSettings
) -> list[ev.ArmOutcome]:
    """Arms A, D (whose round 0 is C's proposals), E, then B at D's token budget, on one problem
    (a repository problem: in its workspace, candidates judged by their patches)."""
    if problem.repo_case:
        from ..domain.tools import StepBudget
        from ..workspace.turns import repository_turns
        from .repo_problems import RepoJudge, problem_workspace, repo_task

        limits = RepoRunLimits()
        with problem_workspace(problem, limits) as workspace:
            task = repo_task(
                problem, workspace, settings.num_agents, settings.rounds, settings.problem_timeout_s
            )
            judge = RepoJudge(problem, task, workspace, limits, settings.weights)

            def edits(run_step: TurnRunner) -> TurnRunner:  # answers' edits become their patches
                return repository_turns(
                    run_step, workspace, engine.tool_protocol, limits, StepBudget(), offer=False
                )

            return _arms(task, settings, engine, dispatch, judge, judge.feedback(), edits)
    task = problem_task(problem, settings)
    judge = CandidateJudge(problem, task, settings)
    return _arms(task, settings, engine, dispatch, judge, feedback_checker(problem, task, settings.sandbox))


def _arms(
    task: Task,
    settings: EvaluationSettings,
    engine: AnyEngineSettings,
    dispatch: DispatchSettings,
    judge: Judge,
    check_code: CodeChecker,
    edits: Callable[[TurnRunner], TurnRunner] | None = None,
) -> list[ev.ArmOutcome]:
    m = settings.max_tokens
    council_settings = CouncilSettings(
        temperature=settings.temperature, propose_max_tokens=m, critique_max_tokens=m, revise_max_tokens=m
    )
    agents = build_council(task.role, task.num_agents, council_settings)
    baseline = agents[0]
    run_turns: TurnRunner = RayTurnDispatcher(
        engine, dispatch, TurnContext(deadline=time.time() + settings.problem_timeout_s)
    )
    if edits is not None:
        run_turns = edits(run_turns)

    start = time.perf_counter()
    greedy = run_turns(
        proposal_requests(task, [baseline.model_copy(update={"temperature": 0.0})], council_settings)
    )
    greedy_wall = time.perf_counter() - start

    start = time.perf_counter()
    proposals = run_turns(proposal_requests(task, agents, council_settings))
    proposals_wall = time.perf_counter() - start
    history = review_rounds(task, agents, council_settings, proposals, run_turns)
    council_wall = time.perf_counter() - start
    council_turns = [*proposals, *history]
    latest = current_versions(council_turns)
    # An agent with no usable version is still a candidate of the council: one that cannot pass.
    finals = [latest.get(p.agent_id, p) for p in proposals]

    start = time.perf_counter()
    fed_settings = council_settings.model_copy(update={"execution_feedback": True})
    fed = run_turns(proposal_requests(task, agents, fed_settings))
    fed_history = review_rounds(task, agents, fed_settings, fed, run_turns, check_code)
    fed_turns = [*fed, *fed_history]
    fed_latest = current_versions(fed_turns)
    fed_finals = [fed_latest.get(p.agent_id, p) for p in fed]
    fed_wall = time.perf_counter() - start

    # B: samples of the baseline agent until they have spent about what the council spent.
    start = time.perf_counter()
    budget = sum(_tokens(t) for t in council_turns)
    measured = [_tokens(t) for t in [*greedy, *proposals] if t.ok]
    per_sample = max(1.0, sum(measured) / len(measured)) if measured else float(settings.max_tokens)
    samples: list[TurnResult] = []
    while len(samples) < settings.max_samples_b:
        spent = sum(_tokens(t) for t in samples)
        if samples and spent >= budget:
            break
        count = min(settings.max_samples_b - len(samples), max(1, math.ceil((budget - spent) / per_sample)))
        drawn = run_turns(_samples(task, baseline, council_settings, len(samples), count))
        samples.extend(drawn)
        if any(t.status is TurnStatus.TIMEOUT for t in drawn):
            break
    samples = samples[: ev.budget_prefix([_tokens(t) for t in samples], budget)]
    sampled_wall = time.perf_counter() - start

    return [
        judge.outcome(ev.Arm.GREEDY, greedy, greedy, greedy_wall),
        judge.outcome(ev.Arm.SAMPLED, samples, samples, sampled_wall),
        judge.outcome(ev.Arm.PROPOSALS, proposals, proposals, proposals_wall),
        judge.outcome(ev.Arm.COUNCIL, council_turns, finals, council_wall),
        judge.outcome(ev.Arm.FEEDBACK, fed_turns, fed_finals, fed_wall),
    ]


_remote_problem = ray.remote(evaluate_problem)


def run_problems(
    problems: Sequence[ev.Problem],
    settings: EvaluationSettings,
    engine: AnyEngineSettings,
    dispatch: DispatchSettings,
    max_concurrent: int,
    progress: Callable[[str], None] | None = None,
) -> list[ev.ArmOutcome]:
    """Fans problems out as Ray tasks, at most `max_concurrent` at once; outcomes in problem order.
    `progress` gets a line per (problem, arm) as each problem finishes (`ev.EvaluationProgress`)."""
    task = _remote_problem.options(
        num_cpus=dispatch.num_cpus_per_turn, max_retries=dispatch.max_worker_retries, retry_exceptions=False
    )
    refs: dict[ray.ObjectRef, int] = {}
    results: dict[int, list[ev.ArmOutcome]] = {}
    tracker = ev.EvaluationProgress(len(problems), len(ev.Arm), time.monotonic())
    pending = list(enumerate(problems))
    while pending or refs:
        while pending and len(refs) < max_concurrent:
            index, problem = pending.pop(0)
            refs[task.remote(problem, settings, engine, dispatch)] = index
        done, _ = ray.wait(list(refs), num_returns=1)
        for ref in done:
            outcomes = results[refs.pop(ref)] = ray.get(ref)
            for line in tracker.problem_done(outcomes, time.monotonic()):
                if progress is not None:
                    progress(line)
    return [outcome for index in sorted(results) for outcome in results[index]]
