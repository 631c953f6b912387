"""`fleet`: the command line of the platform, one module per verb.

fleet dev                     start the local stack (NATS, model server, Ray head, Dagster UI+daemon)
fleet model fetch|serve       the local llama.cpp engine
fleet model pull              copy the served model folder from object storage (cluster pods)
fleet run "TASK" --role DEV   run one deliberation on the local stack and print the decision
fleet deliberate "TASK" ...   publish an approved plan with one task; prints the task id
fleet result TASK_ID          the task's status and results from the Dagster instance

Every verb finds the running local stack through what `fleet dev` recorded in .fleet/stack.json
(stack_file.py); an environment variable (NATS_URL, FLEET_LLM_BASE_URL, …) always wins.
fleet nats init|rejected|redrive   JetStream streams and dead letters
fleet councils list|show|validate  the councils file (FLEET_COUNCILS_FILE)

Each verb imports what it needs when it runs, so `fleet --help` and quick verbs start fast.
"""

from __future__ import annotations

import sys

import click

from . import councils, deliberate, dev, model, nats, result, run
from .common import EXIT_USAGE, REPO_ROOT


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def fleet() -> None:
    """fleet_pipelines: multi-agent deliberation."""
    from pydantic import ValidationError

    from ..settings import FleetSettings

    try:  # every verb reads the settings: a refused or invalid variable stops it here, in one line
        FleetSettings.from_env()
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        click.echo(f"fleet: invalid environment: {fields}", err=True)
        sys.exit(EXIT_USAGE)
    except ValueError as exc:
        click.echo(f"fleet: refused environment: {exc}", err=True)
        sys.exit(EXIT_USAGE)


for verb in (
    dev.dev,
    model.model,
    run.run,
    deliberate.deliberate,
    result.result,
    nats.nats,
    councils.councils,
):
    fleet.add_command(verb)


def main(argv: list[str] | None = None) -> int:
    """The `fleet` command on `argv` (default: the process's arguments); returns its exit code."""
    try:
        fleet.main(args=argv, prog_name="fleet")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return 0


__all__ = ["REPO_ROOT", "fleet", "main"]
