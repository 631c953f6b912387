"""`fleet`: the command line of the platform, one module per verb.

fleet dev                     start the local stack (NATS, model server, Ray head, Dagster UI+daemon)
fleet model fetch|serve       the local llama.cpp engine
fleet model pull              copy the served model folder from object storage (cluster pods)
fleet run "TASK" --role DEV   run one deliberation on the local stack and print the decision
fleet deliberate "TASK" ...   publish an approved plan with one task; prints the task id
fleet result TASK_ID          the task's status and results from the Dagster instance
fleet nats init|rejected|redrive   JetStream streams and dead letters
fleet councils list|show|validate  the councils file (FLEET_COUNCILS_FILE)

Each verb imports what it needs when it runs, so `fleet --help` and quick verbs start fast.
"""

from __future__ import annotations

import click

from . import councils, deliberate, dev, model, nats, result, run
from .common import REPO_ROOT


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def fleet() -> None:
    """fleet_pipelines: multi-agent deliberation."""


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
