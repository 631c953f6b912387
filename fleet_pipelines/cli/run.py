"""`fleet run`: one deliberation in this process, recorded in the stack's Dagster instance."""

from __future__ import annotations

import json
import logging
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
}


def failure_chain(result) -> list[str]:
    """Why a run failed: the first line of each error in its first failure's chain of causes (a
    resource that could not start names its own reason only there)."""
    for event in result.all_events:
        error = getattr(event.event_specific_data, "error", None)
        if event.is_failure or event.event_type_value == "RESOURCE_INIT_FAILURE":
            lines = []
            while error is not None:
                lines.append(error.message.strip().splitlines()[0])  # "ClassName: message"
                error = error.cause
            if lines:
                return lines
    return []


def failed_decision_reasons(result) -> list[str]:
    """The reasons of a decision whose step failed after deciding (no quorum: why, in one line,
    then the quorum message); none when the run failed before its decision."""
    import dagster as dg

    try:
        return list(result.output_for_node("decision").reasons)
    except dg.DagsterInvariantViolationError:
        return []


def progress_logger(init_context) -> logging.Logger:
    """A Dagster logger that prints what a person follows: each phase (step) as it starts, each
    agent turn and each tool call as it finishes (the run log's turn lines: tokens, queue wait,
    service time; a call's tool, arguments, outcome and time), and
    warnings and errors; Dagster's own debug events stay out (`--verbose` shows them)."""
    from ..assets.progress import TURN_LOG_PREFIX

    class Progress(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            meta = getattr(record, "dagster_meta", None) or {}
            event, message = meta.get("dagster_event"), str(meta.get("orig_message", record.getMessage()))
            kind = event.event_type_value if event is not None else None
            if kind == "STEP_START":
                click.echo(f"{meta.get('step_key')} …")
            elif kind is None and message.startswith(TURN_LOG_PREFIX):
                click.echo("  " + message.removeprefix(TURN_LOG_PREFIX))
            elif record.levelno >= logging.WARNING:
                click.echo(f"  {record.levelname.lower()}: {message}", err=True)

    logger = logging.Logger("fleet-run-progress", logging.DEBUG)  # phases are debug events
    logger.addHandler(Progress())
    return logger


def run_loggers(verbose: bool) -> tuple[dict, dict]:
    """The run's loggers and their config: progress only, or with Dagster's console log too."""
    import dagster as dg

    loggers = {"progress": dg.logger(progress_logger)}
    config: dict = {"progress": {}}
    if verbose:
        loggers["console"] = dg.colored_console_logger
        config["console"] = {"config": {"log_level": "DEBUG"}}
    return loggers, config


@click.command(help="Run one deliberation on the local stack and print the decision.")
@task_options
@click.option("--json", "as_json", is_flag=True, help="print the decision as JSON")
@click.option("--verbose", is_flag=True, help="also print Dagster's event log (debug level)")
def run(as_json: bool, verbose: bool, **options) -> None:
    import dagster as dg

    from ..assets.deliberation import build_task, deliberation_partitions, deliberation_run_config
    from ..events.options import NO_NATS
    from ..settings import FleetSettings
    from .common import dagster_home

    task_id, fields = task_fields(options)
    try:
        task = build_task(task_id, fields)
    except dg.Failure as exc:
        click.echo(f"fleet run: {exc.description}", err=True)
        sys.exit(EXIT_USAGE)
    if (
        FleetSettings.from_env().nats_url is None
    ):  # the run publishes its events: fail now, not at `proposals`
        click.echo(f"fleet run: {NO_NATS}", err=True)
        sys.exit(1)

    dagster_home()
    from ..definitions import defs

    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
    click.echo(
        f"task {task_id}: deliberating ({task.num_agents} {task.role.value} agents, {task.rounds} round(s))"
    )
    loggers, logger_config = run_loggers(verbose)
    job = defs.resolve_job_def("deliberation_job").with_logger_defs(loggers)
    result = job.execute_in_process(
        run_config={**deliberation_run_config(fields), "loggers": logger_config},
        instance=instance,
        partition_key=task_id,
        raise_on_error=False,
    )
    if not result.success:
        for line in failure_chain(result):
            click.echo(f"  because {line}", err=True)
        for reason in failed_decision_reasons(result):  # a FAILED decision fails its quorum check
            click.echo(f"  {reason}", err=True)
        click.echo(f"task {task_id}: run {result.run_id} failed; see the Dagster UI", err=True)
        sys.exit(1)
    pushed = result.output_for_node("winning_branch")
    decision = result.output_for_node("decision")
    if as_json:
        summary = {"task_id": task_id, "run_id": result.run_id}
        shown = {**decision.model_dump(mode="json", include=SUMMARY_FIELDS), "pushed_branch": pushed.branch}
        click.echo(json.dumps({**summary, **shown}, indent=2))
    else:
        click.echo(f"status: {decision.status.value}")
        ranking = [r.model_dump() for r in decision.ranking]
        echo_decision(decision.winner_id, ranking, decision.reasons, decision.winner_content)
        if decision.winner_patch:
            said = f", {pushed.said}" if pushed.branch or pushed.error else ""
            click.echo(
                f"\npatch on {decision.base_commit[:12]}{said}: `fleet result {task_id} --patch > fix.diff`"
            )
    sys.exit(0 if decision.status.value in ("COMPLETED", "PARTIAL") else 1)
