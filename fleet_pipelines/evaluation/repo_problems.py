"""Repository problems in the evaluation: the generated repository checked out as a workspace
(the same safe checkout, environment and baseline as a deliberation's), the task the agents
see (its workspace view), candidates judged by their patch in the sandbox: the visible tests are
what the selector may use (as examples are for a function problem), the hidden tests the verdict."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..domain.models import Constraints, RepoSpec, Task, TurnResult
from ..domain.scoring import ScoringWeights, score_proposal
from ..domain.workspace import PatchEvidence, Workspace, extract_patch
from ..scoring.patch import patch_checker
from ..workspace.checkout import make_writable
from ..workspace.prepare import prepare_workspace
from ..workspace.runs import RepoRunLimits, score_patch
from ..workspace.view import prompt_view
from . import arms as ev
from .repo_suite import REPO_CASES, create_repo

REPO_RUBRIC = "The patch applies, fixes the failing test and breaks no other."


@contextmanager
def problem_workspace(problem: ev.Problem, limits: RepoRunLimits) -> Iterator[Workspace]:
    """The problem's repository, generated and checked out in a temporary root (removed after)."""
    case = next(c for c in REPO_CASES if c.name == problem.repo_case)
    root = Path(tempfile.mkdtemp(prefix="fleet-eval-repo-"))
    os.chmod(root, 0o755)
    try:
        source = create_repo(case, root / "source")
        task_id = problem.problem_id.replace("/", ":")
        yield prepare_workspace(
            task_id, RepoSpec(url=str(source), ref="main"), root / "ws", run_limits=limits
        )
    finally:
        make_writable(root)
        shutil.rmtree(root, ignore_errors=True)


def repo_task(
    problem: ev.Problem, workspace: Workspace, num_agents: int, rounds: int, timeout_s: float
) -> Task:
    """What the agents see: the task and the workspace; never the hidden tests."""
    return Task(
        task_id=problem.problem_id.replace("/", ":"),
        description=problem.prompt,
        role=problem.role,
        num_agents=num_agents,
        rounds=rounds,
        constraints=Constraints(rubric=REPO_RUBRIC, timeout_seconds=timeout_s),
        repo=RepoSpec(url=workspace.url, ref=workspace.ref, test_command=workspace.test_command),
        workspace_view=prompt_view(workspace),
    )


def patch_candidate(agent_id: str, evidence: PatchEvidence) -> ev.Candidate:
    """A scored patch as a candidate. The selector's key (`examples_passed`) counts the base
    commit's pass-to-pass tests that still pass and its failing tests that pass across the
    boundary now (never the patch's own, never an in-process result); the verdict needs every
    counted visible and hidden test to pass."""
    visible, hidden = evidence.tests, evidence.hidden
    verified = visible is not None and visible.counted and not visible.forgeable
    passed = bool(evidence.applies and hidden and hidden.counted and hidden.status == "passed")
    passed = passed and (visible is None or (verified and visible.status == "passed"))
    return ev.Candidate(
        agent_id=agent_id,
        has_code=True,
        examples_passed=visible.passed + visible.base_failing_passed if verified else 0,
        examples_total=visible.total + visible.base_failing if verified else 0,
        passed=passed,
        hidden_status="passed" if passed else ("no_apply" if not evidence.applies else "failed"),
    )


class RepoJudge:
    """Candidates of a repository problem: each distinct patch run once in the sandbox."""

    def __init__(
        self,
        problem: ev.Problem,
        task: Task,
        workspace: Workspace,
        limits: RepoRunLimits,
        weights: ScoringWeights,
    ):
        self.problem = problem
        self.task = task
        self.workspace = workspace
        self.limits = limits
        self.weights = weights
        self._patches: dict[str, ev.Candidate] = {}

    def feedback(self):
        """Arm E's checker: the patch checks with the visible tests only."""
        return patch_checker(self.workspace, self.limits)

    def candidate(self, turn: TurnResult) -> ev.Candidate:
        patch = extract_patch(turn.content) if turn.ok else ""
        if not patch:
            return ev.Candidate(
                agent_id=turn.agent_id,
                round=turn.round,
                has_code=False,
                hidden_status="no_code" if turn.ok else turn.status.value,
            )
        held = self._patches.get(patch)
        if held is None:
            evidence = score_patch(self.workspace, patch, self.problem.test, self.limits)
            if evidence.not_run:
                raise RuntimeError(f"sandbox cannot run the repository's tests: {evidence.not_run}")
            held = patch_candidate(turn.agent_id, evidence)
            self._patches[patch] = held
        score = score_proposal(self.task, turn, self.weights).score
        return held.model_copy(update={"agent_id": turn.agent_id, "round": turn.round, "score": score})

    def outcome(
        self, arm: ev.Arm, turns: Sequence[TurnResult], finals: Sequence[TurnResult], wall_s: float
    ) -> ev.ArmOutcome:
        candidates = [self.candidate(t) for t in finals]
        return ev.arm_outcome(self.problem.problem_id, arm, candidates, turns, wall_s)
