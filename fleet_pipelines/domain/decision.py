"""Selection of a winner and the deliberation's status."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from .councils import Convened
from .deliberation import current_versions
from .models import AgentSpec, DeliberationStatus, TurnResult, TurnStatus
from .scoring import ProposalScore


class RankedProposal(BaseModel):
    rank: int
    agent_id: str
    score: float


class Decision(BaseModel):
    status: DeliberationStatus
    winner_id: str | None
    ranking: list[RankedProposal]
    reasons: list[str]
    quorum: int
    usable_agents: int
    failed_agents: list[str]
    timed_out_agents: list[str]
    winner_content: str = ""  # the winning proposal's final version
    winner_not_run: list[str] = []  # the winner's checks that could not run (no sandbox), with why
    winner_patch: str = ""  # a repository task: the winning unified diff (full)
    base_commit: str = ""  # a repository task: the commit the patch applies to


def rank(
    scores: Mapping[str, float],
    council: Sequence[AgentSpec],
    judge: Mapping[str, float | None] | None = None,
) -> list[RankedProposal]:
    """Highest score first; equal scores are ordered by the judge's score (a judge that gave no
    verdict counts lowest), then by council order (the baseline agent first)."""
    order = {a.agent_id: a.index for a in council}
    verdicts = judge or {}

    def key(item: tuple[str, float]) -> tuple[float, float, int]:
        verdict = verdicts.get(item[0])
        return (-item[1], -(verdict if verdict is not None else -1.0), order.get(item[0], 1_000))

    ranked = sorted(scores.items(), key=key)
    return [RankedProposal(rank=i, agent_id=a, score=s) for i, (a, s) in enumerate(ranked, 1)]


def tie_reason(ranking: Sequence[RankedProposal], judge: Mapping[str, float | None]) -> str | None:
    """How a tie at the top was broken, when there was one."""
    if len(ranking) < 2 or ranking[0].score != ranking[1].score:
        return None
    first, second = ranking[0].agent_id, ranking[1].agent_id
    a, b = judge.get(first), judge.get(second)
    if a is not None and a != (b if b is not None else -1.0):
        return f"tie at {ranking[0].score:.3f} broken by the judge ({first} {a:.2f} vs {second} {b})"
    return f"tie at {ranking[0].score:.3f} not separated by the judge; council order kept ({first} first)"


_CAUSES = (  # (error types, what a person reads), first match wins
    (("ContextExceeded",), "the request did not fit the engine's context window"),
    (("FirstTokenTimeout", "IdleTimeout", "NotStarted"), "timeout: the engine did not answer in time"),
    (
        ("APIConnectionError", "ConnectError", "RayActorError", "ActorDiedError", "GetTimeoutError"),
        "the engine is down or unreachable",
    ),
)


def failure_cause(turns: Sequence[TurnResult]) -> list[str]:
    """Why the turns that failed or timed out did, in one line: the most telling cause (the
    engine's window, a timeout, the engine down, else the first error) with how many turns it
    ended and the first such turn's message; none when no turn failed."""
    bad = [t for t in turns if t.status is not TurnStatus.COMPLETED]
    if not bad:
        return []
    said, hit = next(
        ((said, hit) for kinds, said in _CAUSES if (hit := [t for t in bad if t.error_type in kinds])),
        (bad[0].error_type or bad[0].status.value, bad),
    )
    message = " ".join((hit[0].error or "").split())[:200]
    return [f"why: {said} ({len(hit)} of {len(turns)} turns)" + (f": {message}" if message else "")]


def decide(convened: Convened, turns: Sequence[TurnResult], scores: Sequence[ProposalScore]) -> Decision:
    """The decision of the council `convened` from its turns (each agent's final proposal is its
    latest usable version, `current_versions`) and its finals' `scores`. COMPLETED: every agent
    delivered and no turn failed. PARTIAL: a quorum of agents have a final proposal but some turn
    failed or timed out. TIMEOUT: no quorum and the deadline cut turns off. FAILED: no quorum
    otherwise (no usable proposal, or too few). The winner's checks that could not run
    (`ProposalScore.not_run`) are named in the reasons (a winner chosen without its tests says so)."""
    council = convened.agents
    quorum = convened.quorum_size
    finals = current_versions(turns)
    by_agent = {s.agent_id: s for s in scores}
    judge = {a: s.value("judge") for a, s in by_agent.items()}
    failed = sorted({t.agent_id for t in turns if t.status is TurnStatus.FAILED})
    timed_out = sorted({t.agent_id for t in turns if t.status is TurnStatus.TIMEOUT})
    ranking = rank({a: s.score for a, s in by_agent.items() if a in finals}, council, judge)
    usable = len(finals)
    reasons: list[str] = []
    if usable == len(council) and not failed and not timed_out:
        status = DeliberationStatus.COMPLETED
    elif usable >= quorum:
        status = DeliberationStatus.PARTIAL
        reasons.append(
            f"quorum met ({usable}/{len(council)} agents with a proposal, quorum {quorum}); "
            f"failed turns from {failed or 'none'}, timed out {timed_out or 'none'}"
        )
    elif timed_out:
        status = DeliberationStatus.TIMEOUT
        reasons.append(f"deadline hit with {usable}/{len(council)} proposals (quorum {quorum})")
        reasons.extend(failure_cause(turns))
    else:
        status = DeliberationStatus.FAILED
        reasons.extend(failure_cause(turns))
        reasons.append(f"only {usable}/{len(council)} agents produced a proposal (quorum {quorum})")

    winner_id = None
    if status in (DeliberationStatus.COMPLETED, DeliberationStatus.PARTIAL) and ranking:
        winner = ranking[0]
        winner_id = winner.agent_id
        runner_up = f", next {ranking[1].agent_id} at {ranking[1].score:.3f}" if len(ranking) > 1 else ""
        reasons.insert(0, f"{winner.agent_id} ranked first with score {winner.score:.3f}{runner_up}")
        tie = tie_reason(ranking, judge)
        if tie:
            reasons.insert(1, tie)
        winner_not_run = by_agent[winner_id].not_run()
        if winner_not_run:
            reasons.insert(
                1, f"{winner_id} chosen without checks that could not run: {'; '.join(winner_not_run)}"
            )
    else:
        winner_not_run = []
    return Decision(
        status=status,
        winner_id=winner_id,
        ranking=ranking,
        reasons=reasons,
        quorum=quorum,
        usable_agents=usable,
        failed_agents=failed,
        timed_out_agents=timed_out,
        winner_content=finals[winner_id].content if winner_id else "",
        winner_not_run=winner_not_run,
    )


def repository_verdict(
    decision: Decision, scores: Sequence[ProposalScore], patch: str, base_commit: str
) -> Decision:
    """A repository task's decision: the winning patch (`patch`, the winner's diff) kept unless it
    did not apply, and the reasons say first, plainly, when no candidate's patch applied or none
    passed the tests, and when the winner's test result is forgeable (it ran in the process of
    the code it judges). `winner_passes_checks` fails in each of these cases (`gate_failures`)."""
    applied = [s for s in scores if s.value("patch_applies") == 1.0]
    passing = [
        s
        for s in applied
        if s.value("tests") == 1.0 and not (s.check("tests") and s.check("tests").forgeable)
    ]
    checked = [s for s in scores if s.check("patch_applies") and not s.check("patch_applies").not_run]
    reasons = list(decision.reasons)
    winner = next((s for s in scores if s.agent_id == decision.winner_id), None)
    if checked and not applied:
        why = "; ".join(
            f"{s.agent_id}: {s.check('patch_applies').evidence}" for s in scores if s.check("patch_applies")
        )
        reasons.insert(
            0, f"no candidate's patch applied to {base_commit[:12]}: there is no patch to take ({why})"
        )
    elif applied and not passing:
        best = max(applied, key=lambda s: s.value("tests") or 0.0)
        evidence = best.check("tests").evidence if best.check("tests") else "no tests check"
        reasons.insert(
            0,
            f"no candidate's patch passed the tests: the best, {best.agent_id}'s, scored "
            f"{best.value('tests') or 0.0:.2f} ({evidence})",
        )
    tests = winner.check("tests") if winner is not None else None
    if tests is not None and tests.forgeable:
        reasons.append(
            f"{decision.winner_id}'s tests result is forgeable (it ran in the process of the code it "
            f"judges), so it does not count as passing: {tests.evidence}"
        )
    elif tests is not None and tests.value == 1.0 and winner in passing:
        reasons.append(f"{decision.winner_id}'s tests pass on this evidence: {tests.evidence}")
    unchecked = winner is not None and winner not in checked  # no sandbox: kept, the reasons say so
    kept = patch if winner is not None and (winner.value("patch_applies") == 1.0 or unchecked) else ""
    return decision.model_copy(update={"reasons": reasons, "winner_patch": kept, "base_commit": base_commit})
