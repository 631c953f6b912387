"""A deliberation as assets of one dynamic partition (partition key = task id).

deliberation_task -> story_context, workspace -> council -> proposals -> reviews -> scores ->
decision -> winning_branch -> decision_events. A repository task's `workspace` is its read-only
checkout: its view is in the agents' prompts, their turns may call tools on it, their edits become
patches checked against it, and their patches are scored on it. The council is convened once
(`council`, the one step that takes the `council` resource) and every later step reads it, its
sandbox limits and quorum included; `decision` only decides, `winning_branch` pushes a
repository task's winning patch, and `decision_events` tells the world, keeping in the outbox what
NATS does not take.
The assets exchange domain objects (stored as JSON by the `io_manager`); each is a few lines over
the domain, the `turn_runner` and `previews` (what the UI shows).
"""

import dataclasses
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

from ..dagster_private import defs_state_storage
from ..domain.context import StoryContext
from ..domain.councils import Convened, CouncilsFileError
from ..domain.decision import Decision, decide, repository_verdict
from ..domain.deliberation import (
    Claim,
    TurnContext,
    TurnRunner,
    current_versions,
    proposal_requests,
    review_rounds,
)
from ..domain.models import Task, TurnRequest, TurnResult, flat_task_fields, validation_message
from ..domain.scoring import CheckResult, ProposalScore, gate_failures
from ..domain.workspace import PushedBranch, Workspace, extract_patch
from ..events.outbound import outcome_events
from ..history.log import OUTCOME, outcome_metadata
from ..history.runs import run_started
from ..names import (
    COUNCIL,
    DECISION,
    DELIBERATION_GROUP,
    DELIBERATION_JOB,
    DELIBERATION_TASK,
    SCORES,
    TAG_CAUSATION,
    TAG_CORRELATION,
    TAG_ENGINE,
    WINNING_BRANCH,
)
from ..resources.council import CouncilResource
from ..resources.events import NatsResource
from ..resources.repos import ReposResource
from ..resources.turns import TurnRunnerResource
from ..scoring.code import execution_checks
from ..scoring.finals import score_finals
from ..scoring.patch import patch_checker
from ..settings import FleetSettings
from ..workspace.view import prompt_view
from .partitions import deliberation_partitions
from .previews import (
    council_metadata,
    decision_metadata,
    events_metadata,
    feedback_markdown,
    patches_markdown,
    scores_metadata,
    turns_metadata,
)
from .progress import TurnProgress
from .story import report_story_decision, story_context
from .workspace import workspace as workspace_asset


def _config_type(annotation: Any) -> Any:
    """The launchpad's type for a domain type: enums as their values, models as nested config,
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
    return {"ops": {DELIBERATION_TASK: {"config": task_fields}}}


def build_task(task_id: str, fields: dict) -> Task:
    """The validated task; raises dg.Failure naming every invalid field."""
    try:
        return Task.from_fields(task_id, {**fields, "role": str(fields.get("role", "")).upper()})
    except ValidationError as exc:
        raise dg.Failure(
            description=f"invalid deliberation task {task_id!r}: {validation_message(exc)}",
            allow_retries=False,
        ) from exc


def _started(context: dg.AssetExecutionContext) -> float:
    """When this run started (the deliberation's deadline and duration count from it)."""
    return run_started(context.instance, context.run_id) or time.time()


@contextmanager
def _live_turns(
    context: dg.AssetExecutionContext,
    turn_runner: TurnRunnerResource,
    nats: NatsResource,
    convened: Convened,
    tools: tuple[ReposResource, Workspace] | None = None,
) -> Iterator[TurnRunner]:
    """The turn runner with live progress (`assets.progress`): chunks on vllm.streaming.{task_id},
    each turn's events as it ends (keys from run + turn, so a retried step's copies drop), and the
    run log. Events NATS does not take wait in the outbox: progress never fails a deliberation.
    With `tools` (a repository task's workspace), agents' turns may call tools, each call and its
    result on the stream and in the turn's history."""
    deadline = _started(context) + convened.task.constraints.timeout_seconds
    claim = Claim(context.run_id, len(convened.agents))  # the run's claim on the engine (admission)
    with nats.publisher(context.run_id) as sink:
        progress = TurnProgress(context, sink, convened.task)
        turn = TurnContext(deadline, convened.engine, progress.on_chunk, progress.on_result, claim)
        if tools is None or not tools[1].active:
            yield turn_runner.runner(turn)
        else:  # a repository task: agents call tools and give edits, each engine call through the runner
            repos, workspace = tools  # the tool runner reports each turn's end, not each engine call
            step = turn_runner.runner(dataclasses.replace(turn, on_result=None))
            protocol = turn_runner.tool_protocol(convened.engine)
            meter, description = turn_runner.meter(convened.engine), convened.task.description
            yield repos.tool_runner(
                step, workspace, protocol, progress.on_tool, progress.on_result, meter, description, deadline
            )
    if sink.kept:
        context.log.warning(f"{sink.kept} events kept in the outbox until NATS is back: {sink.unreachable}")


_ON_COUNCIL = {"convened": dg.AssetIn(COUNCIL)}
_ASSET = {"partitions_def": deliberation_partitions, "group_name": DELIBERATION_GROUP}


@dg.asset(**_ASSET, kinds={"python"})
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


@dg.asset(**_ASSET, name=COUNCIL, kinds={"python"})
def convened_council(
    context: dg.AssetExecutionContext,
    deliberation_task: Task,
    story_context: StoryContext,
    workspace: Workspace,
    council: CouncilResource,
) -> dg.Output[Convened]:
    """The council that deliberates, convened once per run: its agents, budgets, engine, rubric,
    weights, sandbox limits and quorum, and the councils file version that set them. Every later
    step reads this one (none takes the `council` resource). Its task carries the story's context
    and a repository task's workspace view."""
    view = prompt_view(workspace, deliberation_task.description) if workspace.active else ""
    try:
        convened = council.convene(
            deliberation_task.model_copy(update={"context": story_context, "workspace_view": view})
        )
    except CouncilsFileError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    context.log.info(f"council of {len(convened.agents)} (councils file {convened.version or 'none'})")
    return dg.Output(convened, metadata=council_metadata(convened))


@dg.asset(**_ASSET, ins=_ON_COUNCIL, kinds={"ray"})
def proposals(
    context: dg.AssetExecutionContext,
    convened: Convened,
    workspace: Workspace,
    repos: ReposResource,
    turn_runner: TurnRunnerResource,
    nats: NatsResource,
) -> dg.Output[list[TurnResult]]:
    """Round 0: every agent of the council writes a proposal, all turns in one batch, the story's
    context (and a repository task's workspace, with tools on it) in its prompt."""
    with _live_turns(context, turn_runner, nats, convened, (repos, workspace)) as run_turns:
        results = run_turns(proposal_requests(convened.task, convened.agents, convened.settings))
    ok = sum(r.ok for r in results)
    engine = convened.engine.model if convened.engine else turn_runner.model_name
    context.log.info(f"{ok}/{len(results)} proposals from {engine}")
    return dg.Output(results, metadata={"usable": ok, **turns_metadata(results)})


@dg.asset(**_ASSET, ins=_ON_COUNCIL, kinds={"ray"})
def reviews(
    context: dg.AssetExecutionContext,
    convened: Convened,
    workspace: Workspace,
    proposals: list[TurnResult],
    repos: ReposResource,
    turn_runner: TurnRunnerResource,
    nats: NatsResource,
) -> dg.Output[list[TurnResult]]:
    """R rounds: each agent critiques its peers' current proposals, then revises its own, seeing
    its own code's check results (a repository task: its patch's) where execution feedback is on
    for the role."""
    task, settings, limits = convened.task, convened.settings, convened.sandbox
    patch_checks = _patch_checks(repos, workspace)
    shown: list[tuple[str, list[CheckResult]]] = []

    def check_code(task: Task, text: str) -> list[CheckResult]:
        shown.append(
            (text, patch_checks(task, text) if patch_checks else execution_checks(task, text, limits))
        )
        return shown[-1][1]

    with _live_turns(context, turn_runner, nats, convened, (repos, workspace)) as run_turns:
        history = review_rounds(task, convened.agents, settings, proposals, run_turns, check_code)
    metadata = {"rounds": task.rounds, "execution_feedback": settings.feedback_for(task.role)}
    feedback = feedback_markdown(history, proposals, shown)
    return dg.Output(history, metadata={**metadata, "feedback_shown": feedback, **turns_metadata(history)})


def _then_release(
    run_turns: TurnRunner, turn_runner: TurnRunnerResource, run_id: str, convened: Convened
) -> TurnRunner:
    """The judges are the run's last turns: once they are back, the engine is the next run's
    (dispatch/admission.py) while this one runs its checks and decides."""

    def judge(requests: Sequence[TurnRequest]) -> list[TurnResult]:
        try:
            return run_turns(requests)
        finally:
            turn_runner.release_engine(run_id, convened.engine)

    return judge


def _patch_checks(repos: ReposResource, workspace: Workspace):
    """A repository task's patch checks (None: the code-block checks)."""
    return patch_checker(workspace, repos.run_limits()) if workspace.active else None


@dg.asset(**_ASSET, ins=_ON_COUNCIL, kinds={"python"})
def scores(
    context: dg.AssetExecutionContext,
    convened: Convened,
    workspace: Workspace,
    proposals: list[TurnResult],
    reviews: list[TurnResult],
    repos: ReposResource,
    turn_runner: TurnRunnerResource,
    nats: NatsResource,
) -> dg.Output[list[ProposalScore]]:
    """Each agent's final proposal scored by checks (parse, ruff, tests in the sandbox, coverage,
    LLM judge), in council order, with the evidence of each check."""
    history = [*proposals, *reviews]
    finals = current_versions(history)
    with _live_turns(context, turn_runner, nats, convened) as run_turns:
        judges = _then_release(run_turns, turn_runner, context.run_id, convened)
        scored = score_finals(convened, finals, judges, _patch_checks(repos, workspace))
    metadata = scores_metadata(scored, history, convened.agents)
    if workspace.active:
        metadata["patches"] = patches_markdown(finals)
    return dg.Output(scored, metadata=metadata)


QUORUM_CHECK = dg.AssetCheckSpec(
    "quorum_met",
    asset=DECISION,
    blocking=True,
    description="A quorum of agents (default a majority) delivered a final proposal. Blocking: a FAILED "
    "or TIMEOUT deliberation shows red and nothing downstream runs on it.",
)
WINNER_CHECK = dg.AssetCheckSpec(
    "winner_passes_checks",
    asset=DECISION,
    additional_deps=[SCORES],
    description="The winner's code parses and passes the task's tests (tests that could not run count "
    "as not passed). A warning: the decision stands, the UI says it is unverified.",
)


# The checks are evaluated inside the asset, on this partition's values: a separate @asset_check
# would load the decision of every partition (it has no partition of its own).
@dg.asset(**_ASSET, ins=_ON_COUNCIL, kinds={"python"}, check_specs=[QUORUM_CHECK, WINNER_CHECK])
def decision(
    convened: Convened,
    workspace: Workspace,
    proposals: list[TurnResult],
    reviews: list[TurnResult],
    scores: list[ProposalScore],
) -> Iterator[dg.Output[Decision] | dg.AssetCheckResult]:
    """The winner, the ranking and the status (COMPLETED, PARTIAL, FAILED, TIMEOUT), with reasons."""
    turns = [*proposals, *reviews]
    result = decide(convened, turns, scores)
    if workspace.active:  # a repository task: the decision is the winning patch, when one applied
        patch = extract_patch(result.winner_content) if result.winner_id else ""
        result = repository_verdict(result, scores, patch, workspace.commit)
    # OUTCOME: what the decision log keeps
    metadata = {**decision_metadata(result), OUTCOME: outcome_metadata(convened.task, result, turns)}
    yield dg.Output(result, metadata=metadata)
    yield quorum_met(result)
    yield winner_passes_checks(result, scores)


@dg.asset(**_ASSET, ins=_ON_COUNCIL, name=WINNING_BRANCH, kinds={"git"})
def winning_branch(
    context: dg.AssetExecutionContext,
    convened: Convened,
    workspace: Workspace,
    decision: Decision,
    repos: ReposResource,
) -> dg.Output[PushedBranch]:
    """A repository task's winning patch committed on its base commit and pushed as branch
    `fleet/{task_id}` where a remote is configured (`repos.push_remote`); stored, and shown on the
    decision's metadata too. A push that fails is said here and logged, never a failed step."""
    task = convened.task
    pushed = PushedBranch()
    if workspace.active and decision.winner_patch:
        message = f"fleet: {task.task_id} ({decision.winner_id})\n\n{task.description[:500]}"
        pushed = repos.push(workspace, decision.winner_patch, message)
    if pushed.error:
        context.log.warning(f"push of the winning patch failed: {pushed.error}")
    elif pushed.branch:
        context.log.info(f"winning patch {pushed.said}")
        context.log_event(
            dg.AssetObservation(
                asset_key=DECISION,
                partition=context.partition_key,
                metadata={"pushed_branch": pushed.branch, "pushed_commit": pushed.commit},
            )
        )
    return dg.Output(pushed, metadata={"pushed_branch": pushed.branch or pushed.said})


@dg.asset(**_ASSET, ins=_ON_COUNCIL, kinds={"nats"})
def decision_events(
    context: dg.AssetExecutionContext,
    convened: Convened,
    proposals: list[TurnResult],
    decision: Decision,
    winning_branch: PushedBranch,
    nats: NatsResource,
) -> dg.MaterializeResult:
    """Tells the world: `orchestration.deliberation.completed|failed` (one per run: the failure
    sensor shares its key; a repository task's carries the pushed branch), the old collector's
    `deliberation.completed|failed`, and the decision in its story's `story_decisions`. Events
    NATS does not take wait in the outbox."""
    task, tags, run_id = convened.task, context.run_tags, context.run_id
    duration_ms = (time.time() - _started(context)) * 1000
    correlation, causation = tags.get(TAG_CORRELATION), tags.get(TAG_CAUSATION)
    told = outcome_events(
        task, decision, proposals, run_id, duration_ms, correlation, causation, winning_branch.branch
    )
    sink = nats.deliver(run_id, told)
    report_story_decision(context, task, decision)
    outbox = nats.outbox()
    pending = outbox.pending(context.run_id) if outbox is not None else 0
    return dg.MaterializeResult(metadata=events_metadata(pending, sink.unreachable))


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
    convened_council,
    proposals,
    reviews,
    scores,
    decision,
    winning_branch,
    decision_events,
]
# The assets whose values the io_manager stores (decision_events stores none): what retention removes.
STORED_ASSETS = [a.key.to_user_string() for a in deliberation_assets if a is not decision_events]


def build_deliberation_job(engine_id: str | None = None) -> "dg.UnresolvedAssetJobDefinition":
    """The deliberation job; with `engine_id`, each of its runs carries the `fleet/engine` tag,
    whoever starts it (the planning sensor, the UI's launchpad, `fleet run`), so that the run queue
    limits running deliberations per engine (dagster.yaml)."""
    return dg.define_asset_job(
        DELIBERATION_JOB,
        selection=dg.AssetSelection.groups(DELIBERATION_GROUP),
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
    tags: dict[str, str] | None = None,
) -> dg.ExecuteInProcessResult:
    """Adds the partition and runs one deliberation in this process (tests, benchmarks, notebooks);
    `tags`: the run's (a planning sensor's run request carries its own)."""
    instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
    with defs_state_storage(instance):  # this run's instance, not one left in the context
        return dg.materialize(
            deliberation_assets,
            resources=resources,
            instance=instance,
            partition_key=task_id,
            run_config=deliberation_run_config(task_fields),
            raise_on_error=raise_on_error,
            tags=tags,
        )
