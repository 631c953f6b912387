"""`fleet councils list|show|validate`: the councils file (FLEET_COUNCILS_FILE or --file)."""

from __future__ import annotations

import json

import click

from ..settings import FleetSettings

FILE_HELP = "The councils file (default FLEET_COUNCILS_FILE)."


def _load(path: str | None):
    from ..domain.councils import CouncilsFileError
    from ..resources.council import read_councils

    path = path or FleetSettings.from_env().councils_file
    if not path:
        raise click.UsageError("no councils file: pass --file or set FLEET_COUNCILS_FILE")
    try:
        return path, read_councils(path)
    except CouncilsFileError as exc:
        click.echo(f"invalid: {exc}", err=True)
        raise SystemExit(2) from exc


@click.group()
def councils() -> None:
    """Councils per role, as the councils file sets them."""


@councils.command("list")
@click.option("--file", "path", help=FILE_HELP)
def list_(path: str | None) -> None:
    """One line per role the file configures: engine, model, agents, max tokens."""
    path, loaded = _load(path)
    click.echo(f"{path} version {loaded.version}")
    for role, council in loaded.councils.items():
        engine = loaded.engine(role)
        where = f"{council.engine} ({engine.model} at {engine.base_url})" if engine else "the stack's engine"
        temperatures = ", ".join(f"{a.temperature:g}{'*' if a.diversity else ''}" for a in council.agents)
        budgets = council.budgets.model_dump(exclude_none=True) if council.budgets else {}
        tokens = ", ".join(f"{k} {v}" for k, v in budgets.items())
        if council.max_tokens:
            tokens = f"max_tokens {council.max_tokens}" + (f" over {tokens}" if tokens else "")
        click.echo(
            f"{role.value:<10} engine {where}; agents [{temperatures or 'default'}]; "
            f"budgets {tokens or 'default'}"
        )


@councils.command()
@click.argument("role")
@click.option("--file", "path", help=FILE_HELP)
def show(role: str, path: str | None) -> None:
    """The role's council in full, as JSON (defaults filled in)."""
    from ..domain.models import Role

    path, loaded = _load(path)
    try:
        wanted = Role(role.upper())
    except ValueError as exc:
        raise click.BadParameter(f"{role!r} is not one of {', '.join(r.value for r in Role)}") from exc
    engine = loaded.engine(wanted)
    council = loaded.council(wanted).model_dump(mode="json")
    click.echo(
        json.dumps(
            {
                "file": path,
                "version": loaded.version,
                "role": wanted.value,
                "configured": wanted in loaded.councils,
                **council,
                "engine": {"name": council["engine"], **engine.model_dump()} if engine else None,
            },
            indent=2,
        )
    )


@councils.command()
@click.option("--file", "path", help=FILE_HELP)
def validate(path: str | None) -> None:
    """Exit 0 with a summary when the file is valid; 2 with every invalid field named."""
    path, loaded = _load(path)
    click.echo(
        f"{path}: valid, version {loaded.version}, {len(loaded.councils)} council(s), "
        f"{len(loaded.engines)} engine(s)"
    )
