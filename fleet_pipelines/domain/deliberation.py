"""The deliberation algorithm, independent of where turns run.

Round 0: every agent proposes. Each of R review rounds: every agent critiques each peer's current
proposal, then every author revises its own proposal from the critiques it received. All versions
are kept; an agent whose revision fails keeps its previous version. Turns of one phase are handed
to a `TurnRunner` together, so an engine that batches (llama.cpp slots, vLLM) sees them at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from . import prompts
from .council import CouncilSettings
from .models import AgentSpec, Task, TurnKind, TurnRequest, TurnResult, TurnStatus

TurnRunner = Callable[[Sequence[TurnRequest]], list[TurnResult]]
"""Runs a batch of turns and returns one result per request, in request order."""


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
        max_tokens=settings.max_tokens,
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
            prompts.critique_messages(task, critic, peer.agent_id, current[peer.agent_id].content),
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
) -> list[TurnRequest]:
    """Each author revises its own proposal from the usable critiques it received this round."""
    requests = []
    for author in council:
        if author.agent_id not in current:
            continue
        received = [
            (c.agent_id, c.content) for c in critiques if c.target_agent_id == author.agent_id and c.ok
        ]
        if not received:
            continue
        messages = prompts.revision_messages(task, author, current[author.agent_id].content, received)
        requests.append(_request(task, author, TurnKind.REVISE, round_, messages, settings))
    return requests


def review_rounds(
    task: Task,
    council: Sequence[AgentSpec],
    settings: CouncilSettings,
    proposals: Sequence[TurnResult],
    run_turns: TurnRunner,
) -> list[TurnResult]:
    """Runs the R review rounds after round 0 and returns every critique and revision.

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
        revisions = run_turns(revision_requests(task, council, settings, round_, current, critiques))
        history.extend(revisions)
        if any(r.status is TurnStatus.TIMEOUT for r in revisions):
            break
    return history
