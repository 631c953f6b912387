"""`fleet metrics serve|prometheus`: the fleet's exporter, and a Prometheus scraping the local stack."""

from __future__ import annotations

import os
import sys

import click


@click.group(help="Metrics: the fleet's exporter, a Prometheus scraping the local stack.")
def metrics() -> None:
    pass


@metrics.command(
    help="Serve the fleet's metrics (deliberations, planning events, outbox, planning sensor) on "
    "/metrics, read from NATS and the Dagster instance (`fleet dev` starts it)."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="0.0.0.0 in a pod")
@click.option("--port", type=int, default=9464, show_default=True)
@click.option("--interval", type=float, default=2.0, show_default=True, help="seconds between reads")
def serve(host: str, port: int, interval: float) -> None:
    import dagster as dg

    from .. import wiring
    from ..metrics.exporter import FleetExporter, FleetMetrics
    from ..metrics.exporter import serve as serve_metrics
    from ..settings import FleetSettings
    from .common import dagster_home

    dagster_home()
    nats = wiring.nats(FleetSettings.from_env())
    exporter = FleetExporter(FleetMetrics(), nats, dg.DagsterInstance.get(), nats.outbox(), interval)
    serve_metrics(exporter, host, port)


@metrics.command(
    help="Run Prometheus (Debian's `prometheus` package) in the foreground, scraping the running "
    "local stack and evaluating deploy/monitoring/rules.yml; its data in .fleet/prometheus."
)
@click.option(
    "--port", type=int, default=9097, show_default=True, help="not 9090: where Debian's package runs its own"
)
@click.option("--scrape-interval", type=float, default=5.0, show_default=True, help="seconds")
def prometheus(port: int, scrape_interval: float) -> None:
    from ..metrics.prometheus import prometheus_argv
    from ..settings import FleetSettings
    from ..stack_file import running_stack

    state = FleetSettings.from_env().state_path
    record = running_stack(state)
    if record is None or not record.metrics:
        click.echo(
            "fleet metrics prometheus: no local stack is running here: start `make dev` first", err=True
        )
        sys.exit(1)
    try:
        argv = prometheus_argv(state / "prometheus", port, record.metrics, scrape_interval)
    except FileNotFoundError as exc:
        click.echo(f"fleet metrics prometheus: {exc}", err=True)
        sys.exit(1)
    click.echo(
        f"prometheus: http://127.0.0.1:{port} scraping " + ", ".join(record.metrics.values()), err=True
    )
    os.execv(argv[0], argv)
