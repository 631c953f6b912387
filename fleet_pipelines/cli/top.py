"""`fleet top`: the engines (queue, slots in use, tokens/s) and the deliberations in flight, live.

It reads what Prometheus scrapes, from the same endpoints: the admission queues' series (Ray's
metrics agent), the engine's own `/metrics` and the fleet's exporter, as the running local stack
recorded them (or the URLs given); and the runs in flight from the Dagster instance, the source
the exporter reads. Rates are taken over the frames of the last `window` seconds (Ray's agent
exports every 10 s, so a window under that shows 0 between two exports).
"""

from __future__ import annotations

import sys
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field

import click

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (sample name, labels) -> value


def scrape(url: str) -> Samples:
    """Every sample of a /metrics endpoint (empty when it does not answer)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of a series' samples whose labels include `labels`."""
    return sum(
        v
        for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == x for k, x in labels.items())
    )


def label_values(samples: Samples, name: str, label: str) -> list[str]:
    return sorted({dict(ls)[label] for (n, ls), _ in samples.items() if n == name and label in dict(ls)})


@dataclass
class Rates:
    """Per-second rates of counters over the frames of the last `window_s` seconds."""

    window_s: float
    seen: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)

    def rate(self, key: str, now: float, value: float) -> float:
        points = self.seen.setdefault(key, deque())
        points.append((now, value))
        while len(points) > 2 and now - points[1][0] >= self.window_s:
            points.popleft()
        (t0, v0), (t1, v1) = points[0], points[-1]
        return max(v1 - v0, 0.0) / (t1 - t0) if t1 > t0 else 0.0


def frame(targets: dict[str, str], runs: list[tuple[str, str, float]], rates: Rates) -> str:
    """One screen: engines, then deliberations (`runs`: task id, role, seconds in flight)."""
    now = time.time()
    ray, engine, fleet = (scrape(targets[k]) if k in targets else {} for k in ("ray", "engine", "fleet"))
    lines = [f"fleet top  {time.strftime('%H:%M:%S')}  (rates over {rates.window_s:.0f} s)", ""]
    lines.append(
        f"{'ENGINE':<40} {'MODEL':<24} {'SLOTS':>9} {'WAITING':>7} {'SENT':>6} {'REFUSED':>7} {'TOK/S':>6}"
    )
    engines = label_values(ray, "ray_fleet_engine_slots", "engine")
    for name in engines:
        model = next((dict(ls).get("model", "") for (n, ls) in ray if dict(ls).get("engine") == name), "")
        slots = f"{total(ray, 'ray_fleet_engine_slots_in_use', engine=name):.0f}/"
        slots += f"{total(ray, 'ray_fleet_engine_slots', engine=name):.0f}"
        tokens = total(ray, "ray_fleet_engine_tokens_total", engine=name, type="completion")
        lines.append(
            f"{name:<40} {model[:24]:<24} {slots:>9} "
            f"{total(ray, 'ray_fleet_engine_queue_waiting', engine=name):>7.0f} "
            f"{total(ray, 'ray_fleet_engine_turns_admitted_total', engine=name):>6.0f} "
            f"{total(ray, 'ray_fleet_engine_turns_refused_total', engine=name):>7.0f} "
            f"{rates.rate(name, now, tokens):>6.1f}"
        )
    if not engines:
        lines.append("  (no admission queue yet: it starts with the first turn)")
    if engine:
        own = rates.rate("engine-own", now, total(engine, "llamacpp:tokens_predicted_total"))
        busy = total(engine, "llamacpp:requests_processing")
        lines.append(
            f"  the engine's own /metrics: {own:.1f} tokens/s generated, {busy:.0f} requests decoding"
        )
    lines += ["", "DELIBERATIONS"]
    if fleet:
        queued, flying = (total(fleet, "fleet_deliberation_runs", status=s) for s in ("queued", "in_flight"))
        done = {
            s: total(fleet, "fleet_deliberations_total", status=s)
            for s in ("COMPLETED", "PARTIAL", "FAILED", "TIMEOUT")
        }
        lines.append(
            f"  {flying:.0f} in flight, {queued:.0f} queued; since the exporter started: "
            + ", ".join(f"{v:.0f} {k}" for k, v in done.items())
        )
        accepted, refused = (
            total(fleet, "fleet_planning_events_total", outcome=o) for o in ("accepted", "refused")
        )
        lag = total(fleet, "fleet_planning_sensor_lag_messages")
        lines.append(
            f"  planning: {accepted:.0f} accepted, {refused:.0f} refused; sensor lag {lag:.0f} message(s); "
            f"outbox {total(fleet, 'fleet_outbox_events'):.0f} event(s)"
        )
    lines.append(f"  {'TASK':<48} {'ROLE':<10} {'RUNNING':>8}")
    lines += [f"  {task[:48]:<48} {role:<10} {seconds:>7.0f}s" for task, role, seconds in runs]
    if not runs:
        lines.append("  (none in flight)")
    return "\n".join(lines)


def runs_in_flight(instance) -> list[tuple[str, str, float]]:
    """(task id, role, seconds since start) of the deliberation runs in flight, oldest first."""
    import dagster as dg

    from ..metrics.exporter import IN_FLIGHT
    from ..names import DELIBERATION_JOB, PARTITION_TAG, TAG_ROLE

    records = instance.get_run_records(dg.RunsFilter(job_name=DELIBERATION_JOB, statuses=list(IN_FLIGHT)))
    now = time.time()
    found = [
        (
            r.dagster_run.tags.get(PARTITION_TAG, r.dagster_run.run_id),
            r.dagster_run.tags.get(TAG_ROLE, "-"),
            now - (r.start_time or r.create_timestamp.timestamp()),
        )
        for r in records
    ]
    return sorted(found, key=lambda f: -f[2])


@click.command(help="Engines (queue, slots in use, tokens/s) and deliberations in flight, refreshing.")
@click.option("--interval", type=float, default=2.0, show_default=True, help="seconds between frames")
@click.option("--window", type=float, default=30.0, show_default=True, help="seconds rates are taken over")
@click.option("--once", is_flag=True, help="print one frame and exit")
@click.option("--ray-url", help="Ray's metrics agent (default: the local stack's)")
@click.option("--engine-url", help="the engine's /metrics (default: the local stack's)")
@click.option("--fleet-url", help="the fleet's exporter (default: the local stack's)")
def top(
    interval: float,
    window: float,
    once: bool,
    ray_url: str | None,
    engine_url: str | None,
    fleet_url: str | None,
) -> None:
    import dagster as dg

    from ..settings import FleetSettings
    from ..stack_file import running_stack
    from .common import dagster_home

    record = running_stack(FleetSettings.from_env().state_path)
    targets = dict(record.metrics) if record is not None else {}
    given = {"ray": ray_url, "engine": engine_url, "fleet": fleet_url}
    targets.update({k: v for k, v in given.items() if v})
    if not targets:
        click.echo("fleet top: no local stack is running here: start `make dev`, or give the URLs", err=True)
        sys.exit(1)
    dagster_home()
    rates = Rates(window)
    with dg.DagsterInstance.get() as instance:
        try:
            while True:
                screen = frame(targets, runs_in_flight(instance), rates)
                if once:
                    click.echo(screen)
                    return
                click.echo("\x1b[H\x1b[2J" + screen, nl=True)
                time.sleep(interval)
        except KeyboardInterrupt:
            return
