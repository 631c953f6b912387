"""A deliberation as assets of one dynamic partition (partition key = task id).

deliberation_task -> proposals -> reviews -> scores -> decision. The assets are thin: they
convert frames, call the domain, and hand agent turns to the Ray dispatcher.
"""

import json
import time
from collections.abc import Iterator

import dagster as dg
import pandas as pd
from dagster_ray import RayResource
from pydantic import Field, ValidationError

from ..domain.council import build_council
from ..domain.decision import decide, rank
from ..domain.deliberation import current_versions, proposal_requests, review_rounds
from ..domain.models import Task, TurnKind, TurnResult
from ..domain.scoring import gate_failures
from ..events.outbound import agent_response_events, decision_outcome, deliberation_outcome_event
from ..events.planning import TAG_CAUSATION, TAG_CORRELATION
from ..resources.council import CouncilResource
from ..resources.events import NatsResource
from ..scoring.checks import score_finals
from . import frames

deliberation_partitions = dg.DynamicPartitionsDefinition(name="deliberations")
GROUP = "deliberation"


class DeliberationConfig(dg.Config):
    """The task a council deliberates on. The partition key is its task id."""

    description: str = Field(description="What the council must solve.")
    role: str = Field(default="DEV", description="Council role: DEV, QA, ARCHITECT, DEVOPS or DATA.")
    num_agents: int = Field(default=3, description="Agents in the council (1-10).")
    rounds: int = Field(default=1, description="Review rounds after the first proposals (0-3).")
    rubric: str = Field(default="", description="What a good proposal looks like.")
    requirements: list[str] = Field(default_factory=list, description="Requirements each proposal must meet.")
    metadata: dict[str, str] = Field(default_factory=dict, description="Extra context shown to agents.")
    timeout_seconds: float = Field(default=300.0, description="Deliberation deadline in seconds.")
    tests: str = Field(
        default="",
        description="Python test code run in the sandbox against each proposal's code "
        "(asserts and/or test_* functions; the proposal is importable as `solution`).",
    )
    examples: list[dict[str, str]] = Field(
        default_factory=list,
        description="Input/output examples, each {call: Python expression, expected: Python expression}.",
    )
    story_id: str | None = Field(default=None, description="Story the task belongs to (from planning).")
    plan_id: str | None = Field(default=None, description="Plan the task belongs to (from planning).")


def deliberation_run_config(task_config: dict) -> dict:
    """Run config of deliberation_job for a task config (the fields of DeliberationConfig)."""
    return {"ops": {"deliberation_task": {"config": task_config}}}


def validation_message(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'task'}: {err['msg']}" for err in exc.errors()
    )


def build_task(task_id: str, config: DeliberationConfig) -> Task:
    """The validated task; raises dg.Failure naming every invalid field."""
    try:
        return Task.model_validate(
            {
                "task_id": task_id,
                "description": config.description,
                "role": config.role.upper(),
                "num_agents": config.num_agents,
                "rounds": config.rounds,
                "constraints": {
                    "rubric": config.rubric,
                    "requirements": config.requirements,
                    "metadata": config.metadata,
                    "timeout_seconds": config.timeout_seconds,
                    "tests": config.tests,
                    "examples": config.examples,
                },
                "story_id": config.story_id,
                "plan_id": config.plan_id,
            }
        )
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


def _publish_turns(
    context: dg.AssetExecutionContext, nats: NatsResource, task: Task, results: list[TurnResult]
) -> None:
    """agent.response.completed|failed per turn; keys from run + turn, so a retried step's copies drop."""
    tags = context.run.tags
    nats.publish(
        agent_response_events(
            task, results, context.run_id, tags.get(TAG_CORRELATION), tags.get(TAG_CAUSATION)
        )
    )


def _turn_metadata(results) -> dict[str, dg.MetadataValue]:
    df = frames.turns_to_frame(results)
    return {
        "turns": frames.table(df, frames.TURN_TABLE_COLUMNS) if len(df) else dg.MetadataValue.text("none"),
        "preview": frames.turns_markdown(results),
        "tokens_out": dg.MetadataValue.int(int(df["tokens_out"].sum()) if len(df) else 0),
    }


@dg.asset(partitions_def=deliberation_partitions, group_name=GROUP, kinds={"python"})
def deliberation_task(
    context: dg.AssetExecutionContext, config: DeliberationConfig
) -> dg.Output[pd.DataFrame]:
    """The validated task of this partition."""
    task = build_task(context.partition_key, config)
    return dg.Output(
        frames.task_to_frame(task),
        metadata={
            "role": task.role.value,
            "num_agents": task.num_agents,
            "rounds": task.rounds,
            "description": dg.MetadataValue.md(task.description),
        },
    )


@dg.asset(partitions_def=deliberation_partitions, group_name=GROUP, kinds={"ray"})
def proposals(
    context: dg.AssetExecutionContext,
    deliberation_task: pd.DataFrame,
    council: CouncilResource,
    ray_cluster: RayResource,
    nats: NatsResource,
) -> dg.Output[pd.DataFrame]:
    """Round 0: every agent of the council writes a proposal (one Ray task per agent)."""
    task = frames.task_from_frame(deliberation_task)
    settings = council.council_settings()
    agents = build_council(task.role, task.num_agents, settings)
    run_turns = council.dispatcher(_deadline(context, task))
    results = run_turns(proposal_requests(task, agents, settings))
    ok = sum(r.ok for r in results)
    context.log.info(f"{ok}/{len(results)} proposals from {council.llm.model} via {ray_cluster.display_name}")
    _publish_turns(context, nats, task, results)
    return dg.Output(frames.turns_to_frame(results), metadata={"usable": ok, **_turn_metadata(results)})


@dg.asset(partitions_def=deliberation_partitions, group_name=GROUP, kinds={"ray"})
def reviews(
    context: dg.AssetExecutionContext,
    deliberation_task: pd.DataFrame,
    proposals: pd.DataFrame,
    council: CouncilResource,
    ray_cluster: RayResource,
    nats: NatsResource,
) -> dg.Output[pd.DataFrame]:
    """R rounds: each agent critiques its peers' current proposals, then revises its own."""
    task = frames.task_from_frame(deliberation_task)
    settings = council.council_settings()
    agents = build_council(task.role, task.num_agents, settings)
    history = review_rounds(
        task,
        agents,
        settings,
        frames.turns_from_frame(proposals),
        council.dispatcher(_deadline(context, task)),
    )
    _publish_turns(context, nats, task, history)
    return dg.Output(
        frames.turns_to_frame(history), metadata={"rounds": task.rounds, **_turn_metadata(history)}
    )


@dg.asset(partitions_def=deliberation_partitions, group_name=GROUP, kinds={"python"})
def scores(
    context: dg.AssetExecutionContext,
    deliberation_task: pd.DataFrame,
    proposals: pd.DataFrame,
    reviews: pd.DataFrame,
    council: CouncilResource,
) -> dg.Output[pd.DataFrame]:
    """Each agent's final proposal scored by checks (parse, ruff, tests in the sandbox, coverage,
    LLM judge), with the evidence of each check and the peer critiques it received."""
    task = frames.task_from_frame(deliberation_task)
    agents = build_council(task.role, task.num_agents, council.council_settings())
    history = [*frames.turns_from_frame(proposals), *frames.turns_from_frame(reviews)]
    finals = current_versions(history)
    scored = score_finals(
        task,
        agents,
        finals,
        council.scoring_weights(),
        council.sandbox_limits(),
        council.dispatcher(_deadline(context, task)),
        council.judge_max_tokens,
    )
    ranking = rank(
        {s.agent_id: s.score for s in scored}, agents, {s.agent_id: s.value("judge") for s in scored}
    )
    df = frames.scores_to_frame(scored, ranking, finals)
    if len(df):
        received = {
            agent_id: [
                {"critic": t.agent_id, "round": t.round, "critique": t.content}
                for t in history
                if t.kind is TurnKind.CRITIQUE and t.ok and t.target_agent_id == agent_id
            ]
            for agent_id in df["agent_id"]
        }
        df["critiques"] = df["agent_id"].map(lambda a: json.dumps(received[a]))
        df["gate_failures"] = df["agent_id"].map(
            lambda a: json.dumps(gate_failures(next(s for s in scored if s.agent_id == a)))
        )
    check_columns = [c for c in df.columns if c.startswith("check_")]
    metadata: dict[str, dg.RawMetadataValue] = {
        "scores": frames.table(
            df, ["rank", "agent_id", "score", *check_columns, "code_blocks", "final_round"]
        )
        if len(df)
        else dg.MetadataValue.text("no usable proposal"),
    }
    if len(df):
        top = df.iloc[0]
        metadata["winner_proposal"] = dg.MetadataValue.md(f"## {top['agent_id']}\n\n{top['content']}")
        metadata["evidence"] = dg.MetadataValue.json(
            {row["agent_id"]: json.loads(row["evidence"]) for row in df.to_dict("records")}
        )
        metadata["critiques_received"] = dg.MetadataValue.md(
            "\n\n".join(
                f"### {c['critic']} on {agent_id} (round {c['round']})\n\n{c['critique'][:1_500]}"
                for agent_id, critiques in received.items()
                for c in critiques
            )
            or "_no critiques_"
        )
    return dg.Output(df, metadata=metadata)


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


# The checks are evaluated inside the asset, on this partition's frames: a separate @asset_check
# would load the decision of every partition (it has no partition of its own).
@dg.asset(
    partitions_def=deliberation_partitions,
    group_name=GROUP,
    kinds={"python"},
    check_specs=[QUORUM_CHECK, WINNER_CHECK],
)
def decision(
    context: dg.AssetExecutionContext,
    deliberation_task: pd.DataFrame,
    proposals: pd.DataFrame,
    reviews: pd.DataFrame,
    scores: pd.DataFrame,
    council: CouncilResource,
    nats: NatsResource,
) -> Iterator[dg.Output[pd.DataFrame] | dg.AssetCheckResult]:
    """The winner, the ranking and the status (COMPLETED, PARTIAL, FAILED, TIMEOUT), with reasons."""
    task = frames.task_from_frame(deliberation_task)
    agents = build_council(task.role, task.num_agents, council.council_settings())
    turns = [*frames.turns_from_frame(proposals), *frames.turns_from_frame(reviews)]
    finals = current_versions(turns)
    judge = dict(zip(scores["agent_id"], scores["check_judge"], strict=True)) if len(scores) else {}
    result = decide(
        agents,
        turns,
        finals,
        dict(zip(scores["agent_id"], scores["score"], strict=True)),
        {a: (None if pd.isna(v) else float(v)) for a, v in judge.items()},
        council.quorum,
    )
    winner_content = finals[result.winner_id].content if result.winner_id else ""
    # orchestration.deliberation.completed|failed, one per run (the failure sensor shares the key).
    outcome = decision_outcome(task, result, context.run_id, (time.time() - _run_started(context)) * 1000)
    tags = context.run.tags
    nats.publish([deliberation_outcome_event(outcome, tags.get(TAG_CORRELATION), tags.get(TAG_CAUSATION))])
    ranking_md = "\n".join(f"{r.rank}. {r.agent_id} — {r.score:.3f}" for r in result.ranking) or "_none_"
    frame = frames.decision_to_frame(task, result, winner_content)
    yield dg.Output(
        frame,
        metadata={
            "status": result.status.value,
            "winner": result.winner_id or "none",
            "ranking": dg.MetadataValue.md(ranking_md),
            "reasons": dg.MetadataValue.md("\n".join(f"- {r}" for r in result.reasons)),
        },
    )
    yield quorum_met(frame)
    yield winner_passes_checks(frame, scores)


def quorum_met(decision: pd.DataFrame) -> dg.AssetCheckResult:
    row = decision.iloc[0]
    return dg.AssetCheckResult(
        check_name=QUORUM_CHECK.name,
        passed=bool(row["usable_agents"] >= row["quorum"]),
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{row['usable_agents']} agents with a final proposal, quorum {row['quorum']}",
        metadata={
            "status": str(row["status"]),
            "usable_agents": int(row["usable_agents"]),
            "quorum": int(row["quorum"]),
            "failed_agents": str(row["failed_agents"]),
            "timed_out_agents": str(row["timed_out_agents"]),
        },
    )


def winner_passes_checks(decision: pd.DataFrame, scores: pd.DataFrame) -> dg.AssetCheckResult:
    winner = decision.iloc[0]["winner_id"]
    if winner is None or winner not in set(scores["agent_id"]):
        return dg.AssetCheckResult(
            check_name=WINNER_CHECK.name,
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            description="no winner",
        )
    row = scores[scores["agent_id"] == winner].iloc[0]
    failures = json.loads(row["gate_failures"])
    return dg.AssetCheckResult(
        check_name=WINNER_CHECK.name,
        passed=not failures,
        severity=dg.AssetCheckSeverity.WARN,
        description="; ".join(failures) or f"{winner} passes its code and test checks",
        metadata={"winner": str(winner), "evidence": dg.MetadataValue.json(json.loads(row["evidence"]))},
    )


deliberation_assets = [deliberation_task, proposals, reviews, scores, decision]


def materialize_deliberation(
    instance: dg.DagsterInstance,
    resources: dict,
    task_id: str,
    task_config: dict,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    """Adds the partition and runs one deliberation in this process (tests, benchmarks, notebooks)."""
    instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
    return dg.materialize(
        deliberation_assets,
        resources=resources,
        instance=instance,
        partition_key=task_id,
        run_config=deliberation_run_config(task_config),
        raise_on_error=raise_on_error,
    )
