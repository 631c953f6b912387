"""A deliberation as assets of one dynamic partition (partition key = task id).

deliberation_task -> story_context -> proposals -> reviews -> scores -> decision. The assets exchange domain
objects (stored as JSON by the `io_manager`); each one calls the domain, hands agent turns to the
`turn_runner`, and shows its value in the UI as metadata.
"""

import functools
import time
import types
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field, ValidationError, create_model
from pydantic.fields import FieldInfo

from ..domain.context import StoryContext
from ..domain.councils import EngineEntry
from ..domain.decision import Decision, decide, rank
from ..domain.deliberation import TurnRunner, current_versions, proposal_requests, review_rounds
from ..domain.models import Task, TurnKind, TurnResult, flat_task_fields, validation_message
from ..domain.prompts import feedback_block
from ..domain.scoring import CheckResult, ProposalScore, gate_failures
from ..domain.workspace import Workspace, extract_patch, rationale_of
from ..events.outbound import (
    collector_event,
    decision_outcome,
    deliberation_outcome_event,
)
from ..events.planning import TAG_CAUSATION, TAG_CORRELATION, TAG_ENGINE
from ..history.log import OUTCOME, outcome_metadata
from ..resources.council import CouncilResource
from ..resources.events import NatsResource
from ..resources.repos import ReposConfig
from ..resources.turns import TurnRunnerResource
from ..scoring.checks import execution_checks, score_finals
from ..settings import FleetSettings
from ..workspace.checkout import CheckoutError
from ..workspace.checks import patch_checker
from ..workspace.view import prompt_view
from . import DELIBERATION_JOB
from .partitions import GROUP, deliberation_partitions
from .previews import table, turns_metadata
from .progress import TurnProgress
from .story import report_story_decision, story_context
from .workspace import workspace as workspace_asset


def _config_type(annotation: Any) -> Any:
    """The launchpad's type for a domain type: enums as their values, models as string maps,
    constrained strings as strings. The domain's Task validates the values in the first step."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _config_type(args[0])
    if origin in (types.UnionType, typing.Union):
        converted = [_config_type(a) for a in args]
        union = converted[0]
        for member in converted[1:]:
            union = union | member
        return union
    if origin is list:
        return list[_config_type(args[0])]
    if origin is dict:
        return dict[_config_type(args[0]), _config_type(args[1])]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return str
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _nested_config(annotation)
    return annotation


@functools.cache
def _nested_config(model: type[BaseModel]) -> type[dg.Config]:
    """The launchpad's form of a nested domain model (a task's repository, an example): its
    fields with their defaults and descriptions; the domain model validates the values."""
    return create_model(
        f"{model.__name__}Config",
        __base__=dg.Config,
        __doc__=model.__doc__,
        **{name: _launchpad_field(name, info.annotation, info) for name, info in model.model_fields.items()},
    )


def _launchpad_field(name: str, annotation: Any, info: FieldInfo) -> tuple[Any, FieldInfo]:
    default: Any = "DEV" if name == "role" else info.default  # the launchpad's default council
    if name == "timeout_seconds":  # a task that gives no deadline gets DELIBERATION_TIMEOUT's
        default = FleetSettings.from_env().deliberation_timeout_s
    kwargs = {"default_factory": info.default_factory} if info.default_factory else {"default": default}
    return _config_type(annotation), Field(**kwargs, description=info.description)


DeliberationConfig = create_model(
    "DeliberationConfig",
    __base__=dg.Config,
    __doc__="The task a council deliberates on (the domain Task's flat form). The partition key is its id.",
    **{name: _launchpad_field(name, *spec) for name, spec in flat_task_fields().items()},
)


def deliberation_run_config(task_fields: dict) -> dict:
    """Run config of deliberation_job for a task's flat fields (`Task.fields()`)."""
    return {"ops": {"deliberation_task": {"config": task_fields}}}


def build_task(task_id: str, fields: dict) -> Task:
    """The validated task; raises dg.Failure naming every invalid field."""
    try:
        return Task.from_fields(task_id, {**fields, "role": str(fields.get("role", "")).upper()})
    except ValidationError as exc:
        raise dg.Failure(
            description=f"invalid deliberation task {task_id!r}: {validation_message(exc)}",
            allow_retries=False,
        ) from exc


def _run_started(context: dg.AssetExecutionContext) -> float:
    record = context.instance.get_run_record_by_id(context.run_id)
    return record.start_time if record is not None and record.start_time else time.time()


def _deadline(context: dg.AssetExecutionContext, task: Task) -> float:
    """The deliberation deadline counts from the start of the run."""
    return _run_started(context) + task.constraints.timeout_seconds


@contextmanager
def _live_turns(
    context: dg.AssetExecutionContext,
    turn_runner: TurnRunnerResource,
    nats: NatsResource,
    task: Task,
    engine: EngineEntry | None,
    tools: tuple[ReposConfig, Workspace] | None = None,
) -> Iterator[TurnRunner]:
    """The turn runner with live progress (`assets.progress`): chunks on vllm.streaming.{task_id},
    each turn's events as it ends (keys from run + turn, so a retried step's copies drop), and the
    run log. With `tools` (a repository task's workspace), agents' turns may call tools, each
    call and its result on the stream and in the turn's history."""
    with nats.publisher() as publisher:
        progress = TurnProgress(context, publisher, task)
        deadline = _deadline(context, task)
        if tools is None or not tools[1].active or not tools[0].tools:
            yield turn_runner.runner(deadline, engine, progress.on_chunk, progress.on_result)
        else:  # a repository task: agents call tools, each engine call through the same runner
            repos, workspace = tools
            step = turn_runner.runner(deadline, engine, progress.on_chunk)
            yield repos.tool_runner(step, workspace, progress.on_tool, progress.on_result)
        if publisher.dropped:
            context.log.warning(f"{publisher.dropped} progress chunks could not be published")


@dg.asset(partitions_def=deliberation_partitions, group_name=GROUP, kinds={"python"})
def deliberation_task(context: dg.AssetExecutionContext, config: DeliberationConfig) -> dg.Output[Task]:
    """The validated task of this partition."""
    task = build_task(context.partition_key, config.model_dump())
    return dg.Output(
        task,
        metadata={
            "role": task.role.value,
            "num_agents": task.num_agents,
            "rounds": task.rounds,
            "description": dg.MetadataValue.md(task.description),
        },
    )


def _in_context(task: Task, story: StoryContext, workspace: Workspace) -> Task:
    """The task as the prompts show it: the story's context and, for a repository, its workspace."""
    view = prompt_view(workspace) if workspace.active else ""
    return task.model_copy(update={"context": story, "workspace_view": view})


@dg.asset(partitions_def=deliberation_partitions, group_name=GROUP, kinds={"ray"})
def proposals(
    context: dg.AssetExecutionContext,
    deliberation_task: Task,
    story_context: StoryContext,
    workspace: Workspace,
    council: CouncilResource,
    turn_runner: TurnRunnerResource,
    nats: NatsResource,
) -> dg.Output[list[TurnResult]]:
    """Round 0: every agent of the council writes a proposal, all turns in one batch, the story's
    context (and a repository task's workspace) in its prompt."""
    convened = council.convene(_in_context(deliberation_task, story_context, workspace))
    task, settings, agents = convened.task, convened.settings, convened.agents
    tools = (council.repos, workspace)
    with _live_turns(context, turn_runner, nats, task, convened.engine, tools) as run_turns:
        results = run_turns(proposal_requests(task, agents, settings))
    ok = sum(r.ok for r in results)
    engine = convened.engine.model if convened.engine else turn_runner.model_name
    context.log.info(f"{ok}/{len(results)} proposals from {engine} (councils file {convened.version})")
    return dg.Output(results, metadata={"usable": ok, **convened.metadata(), **turns_metadata(results)})


@dg.asset(partitions_def=deliberation_partitions, group_name=GROUP, kinds={"ray"})
def reviews(
    context: dg.AssetExecutionContext,
    deliberation_task: Task,
    story_context: StoryContext,
    workspace: Workspace,
    proposals: list[TurnResult],
    council: CouncilResource,
    turn_runner: TurnRunnerResource,
    nats: NatsResource,
) -> dg.Output[list[TurnResult]]:
    """R rounds: each agent critiques its peers' current proposals, then revises its own, seeing
    its own code's check results (a repository task: its patch's) where execution feedback is on
    for the role."""
    convened = council.convene(_in_context(deliberation_task, story_context, workspace))
    task, settings, agents = convened.task, convened.settings, convened.agents
    limits = council.sandbox.to_model()
    run_checks = _code_checker(council, workspace)
    shown: list[tuple[str, list[CheckResult]]] = []

    def check_code(task: Task, text: str) -> list[CheckResult]:
        checks = run_checks(task, text) if run_checks else execution_checks(task, text, limits)
        shown.append((text, checks))
        return checks

    tools = (council.repos, workspace)
    with _live_turns(context, turn_runner, nats, task, convened.engine, tools) as run_turns:
        history = review_rounds(task, agents, settings, proposals, run_turns, check_code)
    return dg.Output(
        history,
        metadata={
            "rounds": task.rounds,
            "execution_feedback": settings.feedback_for(task.role),
            "feedback_shown": dg.MetadataValue.md(_feedback_md(history, proposals, shown)),
            **turns_metadata(history),
        },
    )


def _feedback_md(
    history: Sequence[TurnResult], proposals: Sequence[TurnResult], shown: list[tuple[str, list[CheckResult]]]
) -> str:
    """What each author was shown of its own code's checks before revising, by the version checked."""
    versions = {t.content: t for t in [*proposals, *history] if t.kind is not TurnKind.CRITIQUE}
    sections = []
    for text, checks in shown:
        turn = versions.get(text)
        where = f"{turn.agent_id}, version of round {turn.round}" if turn else "a proposal"
        sections.append(f"### {where}\n\n{feedback_block(checks) or '_no check applied_'}")
    return "\n\n".join(sections) or "_no execution feedback (off for this role, or no review round)_"


def _code_checker(council: CouncilResource, workspace: Workspace):
    """A repository task's patch checks (None: the code-block checks)."""
    return patch_checker(workspace, council.repos.run_limits()) if workspace.active else None


def patches_md(finals: dict[str, TurnResult]) -> str:
    """Each final proposal's rationale and its patch as a diff block."""
    sections = []
    for agent_id, final in finals.items():
        patch = extract_patch(final.content)
        diff = f"```diff\n{patch}```" if patch else "_no unified diff_"
        sections.append(
            f"### {agent_id} (round {final.round})\n\n{rationale_of(final.content)[:1_500]}\n\n{diff}"
        )
    return "\n\n".join(sections) or "_no proposal_"


def _critiques_received(history: Sequence[TurnResult], agent_id: str) -> list[TurnResult]:
    return [t for t in history if t.kind is TurnKind.CRITIQUE and t.ok and t.target_agent_id == agent_id]


@dg.asset(partitions_def=deliberation_partitions, group_name=GROUP, kinds={"python"})
def scores(
    context: dg.AssetExecutionContext,
    deliberation_task: Task,
    workspace: Workspace,
    proposals: list[TurnResult],
    reviews: list[TurnResult],
    council: CouncilResource,
    turn_runner: TurnRunnerResource,
    nats: NatsResource,
) -> dg.Output[list[ProposalScore]]:
    """Each agent's final proposal scored by checks (parse, ruff, tests in the sandbox, coverage,
    LLM judge), in council order, with the evidence of each check."""
    convened = council.convene(deliberation_task)
    task, agents = convened.task, convened.agents
    history = [*proposals, *reviews]
    finals = current_versions(history)
    with _live_turns(context, turn_runner, nats, task, convened.engine) as run_turns:
        scored = score_finals(
            task,
            agents,
            finals,
            convened.weights,
            council.sandbox.to_model(),
            run_turns,
            convened.judge_max_tokens,
            _code_checker(council, workspace),
        )
    patches = {"patches": dg.MetadataValue.md(patches_md(finals))} if workspace.active else {}
    if not scored:
        return dg.Output(scored, metadata={"scores": dg.MetadataValue.text("no usable proposal"), **patches})
    ranking = rank(
        {s.agent_id: s.score for s in scored}, agents, {s.agent_id: s.value("judge") for s in scored}
    )
    by_agent = {s.agent_id: s for s in scored}
    rows = []
    for r in ranking:
        s = by_agent[r.agent_id]
        rows.append(
            {
                "rank": r.rank,
                "agent_id": s.agent_id,
                "score": s.score,
                **{f"check_{c.name}": c.value for c in s.checks},
                "code_blocks": s.code_blocks,
                "final_round": finals[s.agent_id].round,
            }
        )
    top = finals[ranking[0].agent_id]
    check_columns = [f"check_{c.name}" for c in scored[0].checks]
    return dg.Output(
        scored,
        metadata={
            "scores": table(
                rows, ["rank", "agent_id", "score", *check_columns, "code_blocks", "final_round"]
            ),
            "winner_proposal": dg.MetadataValue.md(f"## {top.agent_id}\n\n{top.content}"),
            **patches,
            "evidence": dg.MetadataValue.json(
                {s.agent_id: [c.model_dump() for c in s.checks] for s in scored}
            ),
            "critiques_received": dg.MetadataValue.md(
                "\n\n".join(
                    f"### {c.agent_id} on {s.agent_id} (round {c.round})\n\n{c.content[:1_500]}"
                    for s in scored
                    for c in _critiques_received(history, s.agent_id)
                )
                or "_no critiques_"
            ),
        },
    )


QUORUM_CHECK = dg.AssetCheckSpec(
    "quorum_met",
    asset="decision",
    blocking=True,
    description="A quorum of agents (default a majority) delivered a final proposal. Blocking: a FAILED "
    "or TIMEOUT deliberation shows red and nothing downstream runs on it.",
)
WINNER_CHECK = dg.AssetCheckSpec(
    "winner_passes_checks",
    asset="decision",
    additional_deps=["scores"],
    description="The winner's code parses and passes the task's tests (tests that could not run count "
    "as not passed). A warning: the decision stands, the UI says it is unverified.",
)


# The checks are evaluated inside the asset, on this partition's values: a separate @asset_check
# would load the decision of every partition (it has no partition of its own).
@dg.asset(
    partitions_def=deliberation_partitions,
    group_name=GROUP,
    kinds={"python"},
    check_specs=[QUORUM_CHECK, WINNER_CHECK],
)
def decision(
    context: dg.AssetExecutionContext,
    deliberation_task: Task,
    workspace: Workspace,
    proposals: list[TurnResult],
    reviews: list[TurnResult],
    scores: list[ProposalScore],
    council: CouncilResource,
    nats: NatsResource,
) -> Iterator[dg.Output[Decision] | dg.AssetCheckResult]:
    """The winner, the ranking and the status (COMPLETED, PARTIAL, FAILED, TIMEOUT), with reasons."""
    task = deliberation_task
    agents = council.convene(task).agents
    turns = [*proposals, *reviews]
    finals = current_versions(turns)
    result = decide(
        agents,
        turns,
        finals,
        {s.agent_id: s.score for s in scores},
        {s.agent_id: s.value("judge") for s in scores},
        council.quorum,
        {s.agent_id: s.not_run() for s in scores},
    )
    if workspace.active:
        result = _with_patch(context, council, task, workspace, result)
    # orchestration.deliberation.completed|failed, one per run (the failure sensor shares the key),
    # and the old collector's deliberation.completed|failed from the proposals.
    duration_ms = (time.time() - _run_started(context)) * 1000
    outcome = decision_outcome(task, result, context.run_id, duration_ms)
    tags = context.run.tags
    nats.publish(
        [
            deliberation_outcome_event(outcome, tags.get(TAG_CORRELATION), tags.get(TAG_CAUSATION)),
            collector_event(task, proposals, context.run_id, duration_ms),
        ]
    )
    report_story_decision(context, task, result, finals.get(result.winner_id or ""))
    ranking_md = "\n".join(f"{r.rank}. {r.agent_id} — {r.score:.3f}" for r in result.ranking) or "_none_"
    yield dg.Output(
        result,
        metadata={
            "status": result.status.value,
            "winner": result.winner_id or "none",
            "ranking": dg.MetadataValue.md(ranking_md),
            "reasons": dg.MetadataValue.md("\n".join(f"- {r}" for r in result.reasons)),
            **(
                {
                    "winning_patch": dg.MetadataValue.md(f"```diff\n{result.winner_patch}```"),
                    "base_commit": result.base_commit,
                    "pushed_branch": result.pushed_branch or "not pushed",
                }
                if result.winner_patch
                else {}
            ),
            OUTCOME: outcome_metadata(task, result, turns),  # what the decision log keeps
        },
    )
    yield quorum_met(result)
    yield winner_passes_checks(result, scores)


def _with_patch(
    context: dg.AssetExecutionContext,
    council: CouncilResource,
    task: Task,
    workspace: Workspace,
    result: Decision,
) -> Decision:
    """A repository task's decision: the winning patch, pushed as `fleet/{task_id}` where a remote
    is configured (a push that fails is a reason, not a failed decision)."""
    patch = extract_patch(result.winner_content) if result.winner_id else ""
    update: dict[str, Any] = {"winner_patch": patch, "base_commit": workspace.commit}
    if patch and council.repos.push_remote:
        message = f"fleet: {task.task_id} ({result.winner_id})\n\n{task.description[:500]}"
        try:
            update["pushed_branch"] = council.repos.push(workspace, patch, message)
        except CheckoutError as exc:
            update["reasons"] = [*result.reasons, f"push of the winning patch failed: {exc}"]
        else:
            context.log.info(f"winning patch pushed as {update['pushed_branch']}")
    return result.model_copy(update=update)


def quorum_met(decision: Decision) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=QUORUM_CHECK.name,
        passed=decision.usable_agents >= decision.quorum,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{decision.usable_agents} agents with a final proposal, quorum {decision.quorum}",
        metadata={
            "status": decision.status.value,
            "usable_agents": decision.usable_agents,
            "quorum": decision.quorum,
            "failed_agents": str(decision.failed_agents),
            "timed_out_agents": str(decision.timed_out_agents),
        },
    )


def winner_passes_checks(decision: Decision, scores: Sequence[ProposalScore]) -> dg.AssetCheckResult:
    winner = next((s for s in scores if s.agent_id == decision.winner_id), None)
    if winner is None:
        return dg.AssetCheckResult(
            check_name=WINNER_CHECK.name,
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            description="no winner",
        )
    failures = gate_failures(winner)
    return dg.AssetCheckResult(
        check_name=WINNER_CHECK.name,
        passed=not failures,
        severity=dg.AssetCheckSeverity.WARN,
        description="; ".join(failures) or f"{winner.agent_id} passes its code and test checks",
        metadata={
            "winner": winner.agent_id,
            "evidence": dg.MetadataValue.json([c.model_dump() for c in winner.checks]),
        },
    )


deliberation_assets = [
    deliberation_task,
    story_context,
    workspace_asset,
    proposals,
    reviews,
    scores,
    decision,
]


def build_deliberation_job(engine_id: str | None = None) -> "dg.UnresolvedAssetJobDefinition":
    """The deliberation job; with `engine_id`, each of its runs carries the `fleet/engine` tag,
    whoever starts it (the planning sensor, the UI's launchpad, `fleet run`), so that the run queue
    limits running deliberations per engine (dagster.yaml)."""
    return dg.define_asset_job(
        DELIBERATION_JOB,
        selection=dg.AssetSelection.groups(GROUP),
        partitions_def=deliberation_partitions,
        executor_def=dg.in_process_executor,  # ~0.1 s per step vs ~1 s per step with a process per step
        description="One council deliberation: proposals, review rounds, scores and the decision.",
        tags={TAG_ENGINE: engine_id} if engine_id else None,  # job tags are run tags too (UI, GraphQL)
    )


def materialize_deliberation(
    instance: dg.DagsterInstance,
    resources: dict,
    task_id: str,
    task_fields: dict,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    """Adds the partition and runs one deliberation in this process (tests, benchmarks, notebooks)."""
    from dagster._core.storage.defs_state.base import set_defs_state_storage

    instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
    # Dagster loads the definitions against the defs-state storage of the current context; one
    # left there by an instance since collected fails the load ("Attempted to resolve undefined
    # DagsterInstance weakref", seen in a long test session), so this run's instance is named.
    with set_defs_state_storage(instance.defs_state_storage):
        return dg.materialize(
            deliberation_assets,
            resources=resources,
            instance=instance,
            partition_key=task_id,
            run_config=deliberation_run_config(task_fields),
            raise_on_error=raise_on_error,
        )
