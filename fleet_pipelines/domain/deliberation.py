"""The deliberation algorithm, independent of where turns run.

Round 0: every agent proposes. Each of R review rounds: every agent critiques each peer's current
proposal, then every author revises its own proposal from the critiques it received. All versions
are kept; an agent whose revision fails keeps its previous version. Turns of one phase are handed
to a `TurnRunner` together, so an engine that batches (llama.cpp slots, vLLM) sees them at once.

Execution feedback: where the council settings turn it on for the role, a `CodeChecker` runs each
author's current proposal (whether it runs, the task's tests, lint) before the author revises, and
the revision prompt carries what it saw. The checker is passed in: nothing here runs code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import prompts
from .councils import CouncilSettings, EngineEntry
from .models import AgentSpec, Task, TurnKind, TurnRequest, TurnResult, TurnStatus
from .scoring import CheckResult

TurnRunner = Callable[[Sequence[TurnRequest]], list[TurnResult]]
"""Runs a batch of turns and returns one result per request, in request order."""
OnChunk = Callable[[TurnRequest, int, str, int], None]
"""Live progress: (request, chunk index, text, pieces of text in it) as a turn's reply streams."""
OnResult = Callable[[TurnResult], None]
"""Live progress: a turn's result, as soon as the turn ends."""


@dataclass(frozen=True)
class Claim:
    """A run's claim on its engine, for a runner with admission (dispatch/scheduler.py): its
    council uses `size` slots at once."""

    run_id: str
    size: int


@dataclass(frozen=True)
class TurnContext:
    """What a run's batches of turns run under, besides the requests: its deadline, its engine,
    its live progress and its claim on the engine. A `TurnRunner` is a runner bound to one."""

    deadline: float | None
    """A time.time() after which no turn starts and unfinished ones come back TIMEOUT; None: none."""
    engine: EngineEntry | None = None
    """The council's own engine (councils file); None: the runner's."""
    on_chunk: OnChunk | None = None
    """Sees each turn's text as it streams: (request, chunk index, text, pieces of text in it)."""
    on_result: OnResult | None = None
    """Sees each turn's result as soon as the turn ends."""
    claim: Claim | None = None
    """The run's claim on the engine, for a runner with admission (dispatch/admission.py); other
    runners ignore it."""


CodeChecker = Callable[[Task, str], list[CheckResult]]
"""Runs the code of a proposal's text for the task and returns what each check saw."""


def _request(
    task: Task, agent: AgentSpec, kind: TurnKind, round_: int, messages, settings, target=None
) -> TurnRequest:
    return TurnRequest(
        task_id=task.task_id,
        agent_id=agent.agent_id,
        role=task.role,
        kind=kind,
        round=round_,
        messages=messages,
        temperature=agent.temperature,
        max_tokens=settings.budget(kind),
        stop=list(settings.stop),
        target_agent_id=target,
    )


def proposal_requests(
    task: Task, council: Sequence[AgentSpec], settings: CouncilSettings
) -> list[TurnRequest]:
    return [
        _request(task, agent, TurnKind.PROPOSE, 0, prompts.proposal_messages(task, agent), settings)
        for agent in council
    ]


def current_versions(results: Sequence[TurnResult]) -> dict[str, TurnResult]:
    """The latest usable proposal or revision of each agent, by agent id."""
    latest: dict[str, TurnResult] = {}
    for result in results:
        if result.kind is TurnKind.CRITIQUE or not result.ok:
            continue
        held = latest.get(result.agent_id)
        if held is None or result.round >= held.round:
            latest[result.agent_id] = result
    return latest


def critique_requests(
    task: Task,
    council: Sequence[AgentSpec],
    settings: CouncilSettings,
    round_: int,
    current: dict[str, TurnResult],
) -> list[TurnRequest]:
    """Every agent with a live proposal critiques every other live proposal."""
    live = [a for a in council if a.agent_id in current]
    return [
        _request(
            task,
            critic,
            TurnKind.CRITIQUE,
            round_,
            prompts.critique_messages(task, critic, peer, current[peer.agent_id].content),
            settings,
            target=peer.agent_id,
        )
        for critic in live
        for peer in live
        if peer.agent_id != critic.agent_id
    ]


def revision_requests(
    task: Task,
    council: Sequence[AgentSpec],
    settings: CouncilSettings,
    round_: int,
    current: dict[str, TurnResult],
    critiques: Sequence[TurnResult],
    feedback: dict[str, list[CheckResult]] | None = None,
) -> list[TurnRequest]:
    """Each author revises its own proposal from the usable critiques it received this round, and
    from its own code's check results where `feedback` has them."""
    feedback = feedback or {}
    requests = []
    for author in council:
        if author.agent_id not in current:
            continue
        received = [
            (c.agent_id, c.content) for c in critiques if c.target_agent_id == author.agent_id and c.ok
        ]
        if not received:
            continue
        messages = prompts.revision_messages(
            task, author, current[author.agent_id].content, received, feedback.get(author.agent_id, ())
        )
        requests.append(_request(task, author, TurnKind.REVISE, round_, messages, settings))
    return requests


def review_rounds(
    task: Task,
    council: Sequence[AgentSpec],
    settings: CouncilSettings,
    proposals: Sequence[TurnResult],
    run_turns: TurnRunner,
    check_code: CodeChecker | None = None,
) -> list[TurnResult]:
    """Runs the R review rounds after round 0 and returns every critique and revision. With a
    `check_code` and feedback on for the role, each author's current code is checked before it
    revises.

    Stops early when fewer than two agents have a live proposal (nobody to critique) or when a
    phase reports a timeout (the deliberation deadline has passed; later turns would only time out).
    """
    history: list[TurnResult] = []
    for round_ in range(1, task.rounds + 1):
        current = current_versions([*proposals, *history])
        if len(current) < 2:
            break
        critiques = run_turns(critique_requests(task, council, settings, round_, current))
        history.extend(critiques)
        if any(c.status is TurnStatus.TIMEOUT for c in critiques):
            break
        feedback = (
            {agent_id: check_code(task, turn.content) for agent_id, turn in current.items()}
            if check_code is not None and settings.feedback_for(task.role)
            else None
        )
        revisions = run_turns(
            revision_requests(task, council, settings, round_, current, critiques, feedback)
        )
        history.extend(revisions)
        if any(r.status is TurnStatus.TIMEOUT for r in revisions):
            break
    return history
