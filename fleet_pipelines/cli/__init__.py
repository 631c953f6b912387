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
fleet metrics serve|prometheus     the fleet's metrics exporter; a Prometheus scraping the local stack
fleet top                          engines and deliberations in flight, live

Each verb's module is imported when it runs, and imports what it needs then, so `fleet --help`
and quick verbs start fast (`VERBS`).
"""

from __future__ import annotations

import importlib
import sys

import click

from .common import EXIT_USAGE, REPO_ROOT

# Each verb: its module (and command) name and the line `fleet --help` shows for it. The verbs'
# modules are imported when one runs (or is asked for its own help), never for `fleet --help`.
VERBS = {
    "dev": "Start the local stack (NATS, model server, Ray head, Dagster UI + daemon).",
    "model": "The local llama.cpp engine: fetch, serve, pull.",
    "run": "Run one deliberation on the local stack and print the decision.",
    "deliberate": "Publish an approved plan with one task; prints the task id.",
    "result": "A task's status and results.",
    "nats": "NATS JetStream: streams and dead letters.",
    "councils": "The councils that would run: list, show, validate.",
    "metrics": "Metrics: the fleet's exporter, a Prometheus scraping the local stack.",
    "top": "Engines (queue, slots, tokens/s) and deliberations in flight, refreshing.",
}


class Verbs(click.Group):
    """The `fleet` group, its verbs loaded on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in VERBS:
            return None
        return getattr(importlib.import_module(f"{__name__}.{name}"), name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl(list(VERBS.items()))


@click.group(cls=Verbs, context_settings={"help_option_names": ["-h", "--help"]})
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


def main(argv: list[str] | None = None) -> int:
    """The `fleet` command on `argv` (default: the process's arguments); returns its exit code."""
    try:
        fleet.main(args=argv, prog_name="fleet")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return 0


__all__ = ["REPO_ROOT", "fleet", "main"]
