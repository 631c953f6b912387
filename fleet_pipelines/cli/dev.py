"""`fleet dev`: the local stack in the foreground (stack.run_dev supervises it)."""

from __future__ import annotations

import sys

import click


@click.command(
    help="Start the local stack (NATS, model server, Ray head, Dagster UI + daemon); Ctrl-C stops it."
)
@click.option("--port", type=int, default=3000, show_default=True, help="Dagster UI port")
@click.option("--model-port", type=int, default=8080, show_default=True)
@click.option("--ray-port", type=int, default=6380, show_default=True)
@click.option(
    "--nats-port",
    type=int,
    default=4223,
    show_default=True,
    help="embedded nats-server port (not started if NATS_URL is set; 4222 is often the machine's own)",
)
@click.option(
    "--metrics-port", type=int, default=9464, show_default=True, help="the fleet's metrics exporter"
)
@click.option(
    "--ray-metrics-port", type=int, default=9465, show_default=True, help="the Ray head's metrics agent"
)
def dev(
    port: int, model_port: int, ray_port: int, nats_port: int, metrics_port: int, ray_metrics_port: int
) -> None:
    from .. import stack
    from ..sandbox import unavailable_warning
    from ..settings import FleetSettings
    from .common import REPO_ROOT, dagster_home

    if warning := unavailable_warning():
        click.echo(f"fleet dev: warning: {warning}", err=True)

    home = dagster_home()
    ports = stack.DevPorts(
        ui=port,
        model=model_port,
        ray=ray_port,
        nats=nats_port,
        metrics=metrics_port,
        ray_metrics=ray_metrics_port,
    )
    sys.exit(stack.run_dev(ports, FleetSettings.from_env().state_path, home, REPO_ROOT))
