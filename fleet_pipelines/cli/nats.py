"""`fleet nats init|rejected|redrive`: the JetStream streams and the planning dead letters."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import EXIT_USAGE


@click.group(help="NATS JetStream (NATS_URL).")
def nats() -> None:
    pass


@nats.command(
    help="Create or update this system's streams and use other systems' streams that capture its "
    "subjects (never edited); never deletes data. Exits 1 on a conflict."
)
@click.option("--dry-run", is_flag=True, help="show what init would do, change nothing")
def init(dry_run: bool) -> None:
    from .. import wiring
    from ..events.streams import NatsError, StreamAction, describe
    from ..settings import FleetSettings

    try:
        plans = wiring.nats(FleetSettings.from_env()).ensure_streams(dry_run=dry_run)
    except NatsError as exc:
        click.echo(f"fleet nats init: {exc}", err=True)
        sys.exit(1)
    click.echo("\n".join(describe(plans, dry_run)))
    if any(p.action is StreamAction.CONFLICT for p in plans):
        sys.exit(1)


@nats.command(help="List planning messages the sensor rejected, with reasons.")
@click.option("--json", "as_json", is_flag=True, help="one dead-letter payload per line")
def rejected(as_json: bool) -> None:
    from .. import wiring
    from ..events.redrive import dead_letters
    from ..events.streams import NatsError
    from ..settings import FleetSettings

    try:
        found = wiring.nats(FleetSettings.from_env()).session(dead_letters)
    except NatsError as exc:
        click.echo(f"fleet nats rejected: {exc}", err=True)
        sys.exit(1)
    for d in found:
        click.echo(d.model_dump_json() if as_json else f"seq {d.stream_sequence}: {d.reason}")


@nats.command(help="Republish a rejected planning message (as it was, or corrected with --file).")
@click.argument("seq", type=int)
@click.option(
    "--file",
    "fixed",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="the corrected message (JSON) to publish instead of the original",
)
def redrive(seq: int, fixed: Path | None) -> None:
    """SEQ: its PLANNING_EVENTS sequence (see `fleet nats rejected`)."""
    from .. import wiring
    from ..events.redrive import redrive as redrive_message
    from ..events.streams import NatsError
    from ..settings import FleetSettings

    body = fixed.read_bytes() if fixed else None
    try:
        new_seq = wiring.nats(FleetSettings.from_env()).session(lambda s: redrive_message(s, seq, body))
    except (LookupError, ValueError) as exc:  # ValueError: a truncated original, or an InvalidEvent
        click.echo(f"fleet nats redrive: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except NatsError as exc:
        click.echo(f"fleet nats redrive: {exc}", err=True)
        sys.exit(1)
    click.echo(f"re-driven: seq {seq} -> planning.plan.approved seq {new_seq}")
