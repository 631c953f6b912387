"""Decision statuses, quorum and reasons."""

from __future__ import annotations

from fleet_pipelines.domain.decision import decide
from fleet_pipelines.domain.deliberation import current_versions
from fleet_pipelines.domain.models import DeliberationStatus, TurnKind, TurnResult, TurnStatus
from tests import factories

IDS = [a.agent_id for a in factories.council().agents]


def turn(agent_id: str, status: TurnStatus, kind: TurnKind = TurnKind.PROPOSE, round_: int = 0) -> TurnResult:
    content = "proposal" if status is TurnStatus.COMPLETED else ""
    return factories.turn(agent_id, content, kind=kind, round=round_, status=status)


def run(statuses: list[TurnStatus], revisions: list[TurnStatus] = (), quorum: int | None = None):
    turns = [turn(a, s) for a, s in zip(IDS, statuses, strict=True)]
    turns += [turn(a, s, TurnKind.REVISE, 1) for a, s in zip(IDS, revisions, strict=False)]
    scores = [factories.scored(a, 0.5 + i / 10) for i, a in enumerate(current_versions(turns))]
    return decide(factories.council(quorum=quorum), turns, scores)


OK, FAIL, LATE = TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.TIMEOUT


def test_every_agent_delivered_is_completed_with_a_winner_and_reasons():
    d = run([OK, OK, OK])
    assert d.status is DeliberationStatus.COMPLETED and d.winner_id == IDS[2]
    assert d.reasons[0].startswith(f"{IDS[2]} ranked first")


def test_a_failed_revision_keeps_the_earlier_proposal_and_gives_partial():
    d = run([OK, OK, OK], revisions=[OK, LATE])
    assert d.status is DeliberationStatus.PARTIAL and d.usable_agents == 3
    assert d.timed_out_agents == [IDS[1]] and d.winner_id is not None


def test_quorum_met_with_a_failed_agent_is_partial():
    d = run([OK, FAIL, OK])
    assert d.status is DeliberationStatus.PARTIAL and d.failed_agents == [IDS[1]]


def test_no_usable_proposal_is_failed_without_a_winner():
    d = run([FAIL, FAIL, FAIL])
    assert d.status is DeliberationStatus.FAILED and d.winner_id is None and d.ranking == []


def test_deadline_before_quorum_is_timeout():
    d = run([OK, LATE, LATE])
    assert d.status is DeliberationStatus.TIMEOUT and d.winner_id is None
    assert "deadline" in d.reasons[0]


def test_quorum_is_configurable():
    assert run([OK, FAIL, FAIL], quorum=1).status is DeliberationStatus.PARTIAL
    assert run([OK, OK, FAIL], quorum=3).status is DeliberationStatus.FAILED
