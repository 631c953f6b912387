"""Scoring the final proposals: the LLM judge (one turn per final, all in one batch to the
engine), then each final's checks that run something (a code task's `code.execution_checks`, a
repository task's `patch.patch_checker`) and the judge's verdict, weighed with the pure checks of
`domain.scoring` by `score_proposal`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..domain.councils import Convened
from ..domain.deliberation import CodeChecker, TurnRunner
from ..domain.models import Task, TurnKind, TurnRequest, TurnResult
from ..domain.scoring import (
    JUDGE_SCHEMA,
    CheckResult,
    ProposalScore,
    check_named,
    judge_messages,
    parse_judge_reply,
    score_proposal,
)
from .code import execution_checks

JUDGE = check_named("judge")
JUDGE_AGENT_ID = "judge"


def judge_requests(task: Task, finals: Mapping[str, TurnResult], max_tokens: int) -> list[TurnRequest]:
    """One judge turn per final proposal, greedy, constrained to JUDGE_SCHEMA where the engine can."""
    return [
        TurnRequest(
            task_id=task.task_id,
            agent_id=JUDGE_AGENT_ID,
            role=task.role,
            kind=TurnKind.JUDGE,
            round=final.round,
            messages=judge_messages(task, final.content),
            temperature=0.0,
            max_tokens=max_tokens,
            target_agent_id=agent_id,
            response_schema=JUDGE_SCHEMA,
        )
        for agent_id, final in finals.items()
    ]


def judge_check(result: TurnResult | None) -> CheckResult:
    """The judge's verdict as a check; a failed turn or an unparseable reply is recorded, not scored."""
    ran = "LLM judge against the rubric (JSON schema response)"
    if result is None or not result.ok:
        why = "no judge turn" if result is None else f"judge turn {result.status.value}: {result.error}"
        return CheckResult(name=JUDGE, value=None, evidence=f"not scored: {why}", ran=ran)
    verdict = parse_judge_reply(result.content)
    if verdict is None:
        return CheckResult(
            name=JUDGE,
            value=None,
            evidence="not scored: judge reply unparseable",
            ran=ran,
            output=result.content[:500],
        )
    return CheckResult(
        name=JUDGE,
        value=round(verdict.score / 10, 4),
        evidence=f"judge {verdict.score:g}/10: {verdict.rationale}",
        ran=ran,
        output=result.content[:500],
    )


def score_finals(
    convened: Convened,
    finals: Mapping[str, TurnResult],
    run_turns: TurnRunner,
    check_code: CodeChecker | None = None,
) -> list[ProposalScore]:
    """Every final proposal of the council `convened` scored, in council order, by its weights;
    judge turns go to the engine as one batch. `check_code`: the checks that run the proposal
    (default `execution_checks` under the council's sandbox limits; a repository task's patch
    checks)."""
    task = convened.task
    ordered = {a.agent_id: finals[a.agent_id] for a in convened.agents if a.agent_id in finals}
    judged = run_turns(judge_requests(task, ordered, convened.judge_max_tokens))
    verdicts = {r.target_agent_id: r for r in judged}
    scored = []
    for agent_id, final in ordered.items():
        ran = (
            check_code(task, final.content)
            if check_code
            else execution_checks(task, final.content, convened.sandbox)
        )
        tool_checks = [*ran, judge_check(verdicts.get(agent_id))]
        scored.append(score_proposal(task, final, convened.weights, tool_checks))
    return scored
