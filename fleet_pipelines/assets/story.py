"""What a council knows of its story, through lineage.

`story_decisions` (one partition per story) holds the decisions of the story's deliberations: each
`decision` reports one materialization of its story's partition, the decision's winner summary and
rationale in its metadata, so Dagster's own event log is the record. `story_context` (one
partition per task) depends on it in the asset graph and reads the story's earlier decisions from
those materializations, with the plan's story fields and the story's `context.updated` events on
the CONTEXT stream, into the bounded `StoryContext` the prompts include.
"""

import dagster as dg

from ..domain.context import ContextEntry, StoryContext, assemble, decision_text, story_entry
from ..domain.decision import Decision
from ..domain.models import Task
from ..events.context import read_context_updates
from ..events.streams import NatsError
from ..history.runs import run_started
from ..names import DELIBERATION_GROUP, STORY_GROUP
from ..names import STORY_DECISIONS as STORY_DECISIONS_NAME
from ..resources.events import NatsResource
from .partitions import deliberation_partitions, story_partitions
from .previews import story_context_metadata

STORY_DECISIONS = dg.AssetKey(STORY_DECISIONS_NAME)

story_decisions = dg.AssetSpec(
    STORY_DECISIONS,
    partitions_def=story_partitions,
    group_name=STORY_GROUP,
    description="The decisions of a story's deliberations (partition = story id): each deliberation's "
    "`decision` reports one materialization here, its winner summary and rationale as metadata.",
)


def report_story_decision(context: dg.AssetExecutionContext, task: Task, decision: Decision) -> None:
    """Records this deliberation's decision in its story's `story_decisions` partition."""
    if not task.story_id:
        return
    context.instance.add_dynamic_partitions(story_partitions.name, [task.story_id])
    rationale = "; ".join(decision.reasons) or decision.status.value
    context.log_event(
        dg.AssetMaterialization(
            asset_key=STORY_DECISIONS,
            partition=task.story_id,
            description=f"decision of {task.task_id}",
            metadata={
                "task_id": task.task_id,
                "run_id": context.run_id,
                "status": decision.status.value,
                "winner_id": decision.winner_id or "",
                "winner_summary": decision.winner_content,
                "rationale": rationale,
            },
        )
    )


def _value(metadata: dict, key: str) -> str:
    entry = metadata.get(key)
    return str(entry.value) if entry is not None else ""


def prior_decisions(context: dg.AssetExecutionContext, task: Task, before: float) -> list[ContextEntry]:
    """The decisions of the story's other tasks recorded before `before`, oldest first; for a task
    decided twice, the latest."""
    if not task.story_id or not context.instance.has_dynamic_partition(story_partitions.name, task.story_id):
        return []
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(STORY_DECISIONS, asset_partitions=[task.story_id], before_timestamp=before),
        limit=200,
    ).records
    latest: dict[str, ContextEntry] = {}
    for record in sorted(records, key=lambda r: r.storage_id):
        metadata = record.asset_materialization.metadata
        task_id = _value(metadata, "task_id")
        if not task_id or task_id == task.task_id:
            continue
        text = decision_text(
            _value(metadata, "winner_id") or None,
            _value(metadata, "status"),
            _value(metadata, "winner_summary"),
            _value(metadata, "rationale"),
        )
        source = f"decision of {task_id} (run {_value(metadata, 'run_id')[:8]})"
        latest.pop(task_id, None)
        latest[task_id] = ContextEntry(kind="decision", source=source, text=text)
    return list(latest.values())


def context_events(
    context: dg.AssetExecutionContext, nats: NatsResource, story_id: str | None
) -> tuple[list[ContextEntry], str]:
    """The story's `context.updated` events, and what the UI says of reading them. Without NATS
    the context is built without them (a warning), never failing the run."""
    if not story_id:
        return [], "no story id"
    try:
        updates, skipped = nats.session(lambda session: read_context_updates(session, story_id))
    except NatsError as exc:
        context.log.warning(f"context events of story {story_id} not read: {exc}")
        return [], f"not read: {exc}"
    return updates, f"{len(updates)} read" + (f", {skipped} unreadable skipped" if skipped else "")


@dg.asset(
    partitions_def=deliberation_partitions,
    group_name=DELIBERATION_GROUP,
    kinds={"python"},
    deps=[dg.AssetDep(STORY_DECISIONS, partition_mapping=dg.AllPartitionMapping())],
)
def story_context(
    context: dg.AssetExecutionContext, deliberation_task: Task, nats: NatsResource
) -> dg.Output[StoryContext]:
    """The story's context the prompts include: the plan's story fields, the story's context events
    (CONTEXT stream, `context.updated.{story_id}`) and the decisions of its earlier deliberations
    (`story_decisions`), bounded in size, each entry with its source."""
    task = deliberation_task
    story = story_entry(task.plan_id, task.story_title, task.story_description, task.acceptance_criteria)
    started = run_started(context.instance, context.run_id)
    decisions = prior_decisions(context, task, before=started) if started else []
    updates, events_note = context_events(context, nats, task.story_id)
    built = assemble(task.story_id, story, decisions, updates)
    return dg.Output(built, metadata=story_context_metadata(built, events_note, len(decisions)))
