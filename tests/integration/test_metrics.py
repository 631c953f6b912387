"""A real Prometheus (Debian's package) scraping the fleet's exporter, the Ray head's metrics agent
and the llama.cpp server, while a planned deliberation runs and a plan is refused: the series
move by what happened, carry no unbounded label, and every dashboard query answers from them."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import prometheus_client
import pytest

from fleet_pipelines import stack
from fleet_pipelines.assets.deliberation import materialize_deliberation
from fleet_pipelines.cli import top
from fleet_pipelines.domain.councils import engine_id
from fleet_pipelines.domain.models import TurnKind
from fleet_pipelines.events.outbox import Outbox
from fleet_pipelines.metrics.exporter import SENSOR_TAG, FleetExporter, FleetMetrics
from fleet_pipelines.metrics.prometheus import prometheus_argv
from fleet_pipelines.names import DELIBERATION_JOB, TAG_ENGINE
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.sensors.planning import PLANNING_SENSOR
from tests.integration.test_run_index import ORIGIN
from tests.integration.test_sensor_planning import publish_raw, tick
from tests.prometheus import dashboard_queries, ensure_prometheus

PLAN = {
    "story_id": "S-43",
    "plan_id": "P-43",
    "approved_by": "po",
    "timestamp": "2026-11-28T10:00:00Z",
    "tasks": [
        {
            "description": "Write a Python function add(a, b) that returns the sum.",
            "role": "DEV",
            "num_agents": 2,
            "rounds": 0,
            "tests": "from solution import add\n\nassert add(2, 3) == 5\n",
        }
    ],
}
# Every label a series may carry: Prometheus's own, then ours. No task, run or story id.
LABELS = {"__name__", "job", "instance", "engine", "model", "kind", "status", "type", "role", "reason"}
LABELS |= {"outcome", "source", "passed", "le", "quantile"}


class Prometheus:
    """Prometheus's HTTP API."""

    def __init__(self, url: str):
        self.url = url

    def api(self, path: str, **params: str) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def value(self, expr: str) -> float:
        """The value of a query that gives one number (0 when it gives no series)."""
        result = self.api("query", query=expr)["result"]
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else 0.0

    def wait(self, check: Callable[[], bool], what: str, timeout_s: float = 90) -> None:
        """Ray's metrics agent exports every 10 s (Ray's default), Prometheus scrapes every 0.5 s."""
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, f"not seen in Prometheus after {timeout_s:.0f} s: {what}"
            time.sleep(0.5)


@pytest.fixture
def exporter_url(nats_resource, dagster_instance, tmp_path: Path) -> Iterator[str]:
    """The fleet's exporter on a free port, reading the test's NATS and Dagster instance."""
    metrics = FleetMetrics()
    instance = dg.DagsterInstance.from_ref(dagster_instance.get_ref())
    outbox = Outbox(str(tmp_path / "storage" / "outbox"))
    exporter = FleetExporter(metrics, nats_resource, instance, outbox, interval_s=0.5)
    port = stack.free_port()
    server, _ = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    reader = threading.Thread(target=lambda: loop.run_until_complete(exporter.run(stop)), daemon=True)
    reader.start()
    yield f"http://127.0.0.1:{port}/metrics"
    loop.call_soon_threadsafe(stop.set)
    reader.join(30)
    server.shutdown()
    instance.dispose()


@pytest.mark.heavy(60)
def test_prometheus_sees_a_deliberation_a_refused_plan_and_the_engine(
    stack_env, dagster_instance, nats_resource, exporter_url: str, llm_server: str, tmp_path: Path
):
    import ray

    ray.init(ignore_reinit_error=True, log_to_driver=False)
    [head] = [n for n in ray.nodes() if n["Alive"]]
    targets = {
        "fleet": exporter_url,
        "ray": f"http://127.0.0.1:{head['MetricsExportPort']}/metrics",
        "engine": llm_server.removesuffix("/v1") + "/metrics",
    }
    port = stack.free_port()
    ensure_prometheus()
    argv = prometheus_argv(tmp_path / "prometheus", port, targets, interval_s=0.5)
    server = stack.launch("prometheus", argv, tmp_path / "logs")
    try:
        prom = Prometheus(f"http://127.0.0.1:{port}")
        server.wait_ready(lambda: stack.http_ok(f"{prom.url}/-/ready"), 60)
        prom.wait(lambda: prom.value('sum(up{job=~"fleet|ray|engine"})') == 3, "every target up")

        engine = llm_server.removesuffix("/")
        on_engine = f'engine="{engine}"'

        def turns(name: str, labels: str = "") -> float:
            return prom.value(f"sum(ray_fleet_engine_{name}{{{on_engine}{labels}}})")

        before = {
            "propose": turns("turns_total", ',kind="propose"'),
            "turns": turns("turns_total"),
            "admitted": turns("turns_admitted_total"),
            "waits": turns("wait_seconds_count"),
            "services": turns("service_seconds_count"),
            "completion": turns("tokens_total", ',kind="propose",type="completion"'),
            "engine_tokens": prom.value("sum(llamacpp:tokens_predicted_total)"),
        }

        publish_raw(nats_resource, b"\xff not json")
        publish_raw(nats_resource, json.dumps(PLAN).encode())
        [request], _, _, _ = tick(dagster_instance, nats_resource, None)
        fields = request.run_config["ops"]["deliberation_task"]["config"]
        resources = {**stack_env, "nats": nats_resource, "council": CouncilResource(max_tokens=24)}
        tags = {**request.tags, SENSOR_TAG: PLANNING_SENSOR}  # as the daemon starts a sensor's run
        result = materialize_deliberation(
            dagster_instance, resources, request.partition_key, fields, tags=tags
        )
        assert result.success
        decision = result.output_for_node("decision")
        proposals = result.output_for_node("proposals")
        assert [p.kind for p in proposals] == [TurnKind.PROPOSE] * 2

        status = decision.status.value
        reason = {"COMPLETED": "none", "PARTIAL": "turns_lost", "TIMEOUT": "deadline"}.get(
            status, "no_quorum"
        )
        outcome = f'fleet_deliberations_total{{role="DEV",status="{status}",reason="{reason}"}}'
        prom.wait(lambda: prom.value(outcome) == 1, outcome)
        assert prom.value("sum(fleet_deliberations_total)") == 1
        assert prom.value("sum(fleet_deliberation_duration_seconds_count)") == 1
        assert prom.value('fleet_planning_events_total{outcome="refused",reason="not_json"}') == 1
        prom.wait(lambda: prom.value('fleet_planning_events_total{outcome="accepted"}') == 1, "accepted plan")
        assert prom.value('sum(fleet_planning_events_total{outcome="refused"})') == 1

        # The sandbox ran each proposal's code against the task's tests (where it had code).
        scores = result.output_for_node("scores")
        sandboxed = [c for s in scores for c in s.checks if c.name == "tests" and (c.ran or c.not_run)]
        prom.wait(lambda: prom.value("sum(fleet_sandbox_runs_total)") == len(sandboxed), "sandbox runs")
        not_run = prom.value('fleet_sandbox_runs_total{status="not_run"}')
        assert not_run == sum(c.not_run for c in sandboxed)

        # Whether the winner passed its checks, as the decision's `winner_passes_checks` said.
        [check] = [e for e in result.get_asset_check_evaluations() if e.check_name == "winner_passes_checks"]
        winners = f'fleet_deliberation_winners_total{{role="DEV",passed="{str(check.passed).lower()}"}}'
        prom.wait(lambda: prom.value(winners) == 1, winners)
        assert prom.value("sum(fleet_deliberation_winners_total)") == 1

        # The admission queue's series (through Ray's metrics agent) moved by this run's turns.
        prom.wait(lambda: turns("turns_total", ',kind="propose"') - before["propose"] == 2, "2 proposals")
        prom.wait(lambda: turns("slots_in_use") == 0 and turns("queue_waiting") == 0, "an idle queue")
        ended = 2 + decision.usable_agents  # two proposals and a judge's verdict on each final one
        prom.wait(lambda: turns("turns_total") - before["turns"] == ended, f"{ended} turns ended")
        assert turns("turns_admitted_total") - before["admitted"] == ended
        assert turns("wait_seconds_count") - before["waits"] == ended
        assert turns("service_seconds_count") - before["services"] == ended
        completion = sum(p.tokens_out for p in proposals)
        assert turns("tokens_total", ',kind="propose",type="completion"') - before["completion"] == completion
        assert turns("slots") == 3  # the session's llama.cpp server: 3 slots
        # The engine's own series, scraped from llama.cpp (shared by the session: at least ours).
        assert prom.value("sum(llamacpp:tokens_predicted_total)") - before["engine_tokens"] >= completion

        # `fleet top` reads the same endpoints: the engine's queue, the planning events.
        screen = top.frame(targets, top.runs_in_flight(dagster_instance), top.Rates(30))
        assert f"{engine} " in screen and " 0/3 " in screen
        assert "0 in flight" in screen and "planning: 1 accepted, 1 refused" in screen

        # A run queued for the engine (the run queue holds it: its fleet/engine tag) is counted
        # under that engine.
        tag = engine_id(engine)
        queued = dg.DagsterRun(
            job_name=DELIBERATION_JOB,
            status=dg.DagsterRunStatus.QUEUED,
            tags={TAG_ENGINE: tag},
            remote_job_origin=ORIGIN,
        )
        queued_id = dagster_instance.add_run(queued).run_id
        runs = f'fleet_deliberation_runs{{engine="{tag}",status="queued"}}'
        prom.wait(lambda: prom.value(runs) == 1, runs)
        assert prom.value('sum(fleet_deliberation_runs{status="queued"})') == 1

        # No series carries a task, run or story id, or a label outside the list.
        series = prom.api("series", **{"match[]": '{job=~"fleet|ray|engine"}'})
        assert series
        unbounded = [
            s
            for s in series
            if set(s) - LABELS
            or any(v in (request.partition_key, result.run_id, queued_id, "S-43", "P-43") for v in s.values())
        ]
        assert unbounded == []

        # The alert rules load in the real Prometheus; every dashboard query answers with series.
        groups = prom.api("rules")["groups"]
        assert {r["name"] for g in groups for r in g["rules"]} >= {"FleetDeliberationsFailing"}
        assert all(r["health"] == "ok" for g in groups for r in g["rules"])
        for expr in dashboard_queries():
            prom.wait(lambda expr=expr: bool(prom.api("query", query=expr)["result"]), expr, 30)
    finally:
        server.stop()
