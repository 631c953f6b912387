"""`fleet deliberate`: publish an approved plan with one task; the planning sensor runs it."""

from __future__ import annotations

import sys
import uuid

import click

from .common import EXIT_USAGE, task_fields, task_options


@click.command(help="Publish an approved plan with one task; prints the task id once JetStream acks.")
@task_options
@click.option("--story", default="adhoc", show_default=True, help="story id of the plan")
@click.option("--plan", help="plan id (default: plan-TASK_ID)")
@click.option("--approved-by", default="fleet-cli", show_default=True)
def deliberate(story: str, plan: str | None, approved_by: str, **options) -> None:
    from .. import wiring
    from ..events.planning import InvalidEvent, StreamMessage, plan_deliberations, single_task_plan
    from ..events.streams import PLAN_APPROVED, PLANNING_STREAM, NatsError
    from ..settings import FleetSettings

    task_id, fields = task_fields(options)
    try:
        envelope = single_task_plan(
            task_id,
            fields,
            story_id=story,
            plan_id=plan or f"plan-{task_id}",
            approved_by=approved_by,
            idempotency_key=f"fleet-deliberate:{uuid.uuid4().hex}",
        )
        # The sensor's own check, so a bad task fails here and not in the dead-letter subject.
        plan_deliberations(
            StreamMessage(
                stream=PLANNING_STREAM, seq=0, subject=PLAN_APPROVED, data=envelope.model_dump_json().encode()
            )
        )
    except (InvalidEvent, ValueError) as exc:
        click.echo(f"fleet deliberate: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    try:
        [(seq, _)] = wiring.nats(FleetSettings.from_env()).publish([(PLAN_APPROVED, envelope)])
    except NatsError as exc:
        click.echo(f"fleet deliberate: {exc}", err=True)
        sys.exit(1)
    click.echo(task_id)
    click.echo(
        f"accepted: {PLANNING_STREAM} seq {seq}; follow with `fleet result {task_id} --wait 600`", err=True
    )
