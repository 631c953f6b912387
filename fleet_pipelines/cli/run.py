"""`fleet run`: one deliberation in this process, recorded in the stack's Dagster instance."""

from __future__ import annotations

import json
import sys

import click

from .common import EXIT_USAGE, echo_decision, task_fields, task_options

SUMMARY_FIELDS = {
    "status",
    "winner_id",
    "ranking",
    "reasons",
    "winner_content",
    "winner_patch",
    "base_commit",
    "pushed_branch",
}


@click.command(help="Run one deliberation on the local stack and print the decision.")
@task_options
@click.option("--json", "as_json", is_flag=True, help="print the decision as JSON")
def run(as_json: bool, **options) -> None:
    import dagster as dg

    from ..assets.deliberation import build_task, deliberation_partitions, deliberation_run_config
    from .common import dagster_home

    task_id, fields = task_fields(options)
    try:
        task = build_task(task_id, fields)
    except dg.Failure as exc:
        click.echo(f"fleet run: {exc.description}", err=True)
        sys.exit(EXIT_USAGE)

    dagster_home()
    from ..definitions import defs

    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
    click.echo(
        f"task {task_id}: deliberating ({task.num_agents} {task.role.value} agents, {task.rounds} round(s))"
    )
    result = defs.resolve_job_def("deliberation_job").execute_in_process(
        run_config=deliberation_run_config(task.fields()),
        instance=instance,
        partition_key=task_id,
        raise_on_error=False,
    )
    if not result.success:
        click.echo(f"task {task_id}: run {result.run_id} failed; see the Dagster UI", err=True)
        sys.exit(1)
    decision = result.output_for_node("decision")
    if as_json:
        summary = {"task_id": task_id, "run_id": result.run_id}
        click.echo(
            json.dumps({**summary, **decision.model_dump(mode="json", include=SUMMARY_FIELDS)}, indent=2)
        )
    else:
        click.echo(f"status: {decision.status.value}")
        ranking = [r.model_dump() for r in decision.ranking]
        echo_decision(decision.winner_id, ranking, decision.reasons, decision.winner_content)
    sys.exit(0 if decision.status.value in ("COMPLETED", "PARTIAL") else 1)
