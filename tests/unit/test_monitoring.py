"""The monitoring files and the exporter's classes, offline: promtool (Debian's prometheus package,
installed by `make prometheus` where missing) checks and tests the alert rules, parses every
dashboard query and the PrometheusRule's rules, which are rules.yml's; every refusal of the
planning reader gets a bounded class; the exporter's series carry bounded labels only."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml

from fleet_pipelines import stack
from fleet_pipelines.domain.models import DeliberationStatus, Role
from fleet_pipelines.events.models import DecisionRecord, DeliberationOutcome, PlanningRejected
from fleet_pipelines.events.outbound import rejected_event
from fleet_pipelines.events.outbox import Outbox
from fleet_pipelines.events.planning import InvalidEvent, plan_deliberations, refusal_class
from fleet_pipelines.metrics.exporter import (
    REFUSALS,
    FleetExporter,
    FleetMetrics,
    reason_class,
    sandbox_status,
)
from fleet_pipelines.metrics.prometheus import scrape_config
from fleet_pipelines.names import DELIBERATION_JOB, TAG_ENGINE
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.stack_file import read_stack, write_stack
from tests.integration.test_run_index import ORIGIN
from tests.prometheus import MONITORING, dashboard_queries, ensure_prometheus
from tests.unit.deploy_objects import load_docs, workload_pods
from tests.unit.test_deploy_manifests import KUBERNETES_VERSIONS, k8s_errors
from tests.unit.test_deploy_security import POLICY_VERSIONS, violations
from tests.unit.test_events import LEGACY, message


def promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess:
    return subprocess.run([str(ensure_prometheus()), *args], cwd=cwd, capture_output=True, text=True)


def test_the_alert_rules_check_and_each_alert_fires_and_stays_quiet_in_promtool():
    checked = promtool("check", "rules", "rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "rules-test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert has a case where it fires and one where it does not.
    alerts = {
        r["alert"]
        for g in yaml.safe_load((MONITORING / "rules.yml").read_text())["groups"]
        for r in g["rules"]
    }
    cases = [
        c
        for t in yaml.safe_load((MONITORING / "rules-test.yml").read_text())["tests"]
        for c in t["alert_rule_test"]
    ]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == alerts
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == alerts


def test_a_broken_rule_fails_promtool(tmp_path: Path):
    """promtool is the judge here: an expression that does not parse fails the check."""
    bad = {"groups": [{"name": "x", "rules": [{"alert": "A", "expr": "sum(rate(x[5m]) >"}]}]}
    (tmp_path / "bad.yml").write_text(yaml.safe_dump(bad))
    assert promtool("check", "rules", "bad.yml", cwd=tmp_path).returncode != 0


def test_every_dashboard_query_parses(tmp_path: Path):
    """As recording rules, which promtool parses (the integration test runs them on a real Prometheus)."""
    queries = dashboard_queries()
    assert len(queries) >= 15
    rules = [{"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(queries)]
    (tmp_path / "dashboard.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    checked = promtool("check", "rules", "dashboard.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_prometheusrule_carries_the_rules_file_as_it_is():
    [rule] = [d for d in yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text()) if d]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"] == yaml.safe_load((MONITORING / "rules.yml").read_text())
    built = subprocess.run(
        [sys.executable, "build.py", "--check"], cwd=MONITORING, capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, built.stdout + built.stderr


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\xff not json", "not_json"),
        (b'"a string"', "not_json"),
        (b'{"x": "' + b"y" * 300_000 + b'"}', "too_large"),
        (
            json.dumps(
                {
                    "event_type": "planning.plan.rejected",
                    "idempotency_key": "k",
                    "correlation_id": "c",
                    "payload": {},
                }
            ).encode(),
            "event_type",
        ),
        (b'{"event_type": 5, "payload": {}}', "envelope"),
        (
            json.dumps({"plan_id": "P", "approved_by": "x", "roles": ["DEV"], "approved_at": "t"}).encode(),
            "invalid_field",
        ),
        (
            json.dumps(
                {"story_id": "S", "plan_id": "P", "approved_by": "x", "roles": ["CHEF"], "timestamp": "t"}
            ).encode(),
            "invalid_field",
        ),
        (
            json.dumps(
                {
                    "story_id": "S",
                    "plan_id": "P",
                    "approved_by": "x",
                    "timestamp": "t",
                    "tasks": [{"task_id": "T", "description": "d", "role": "DEV"}] * 2,
                }
            ).encode(),
            "duplicate_tasks",
        ),
        (LEGACY.replace(b"US-42", b"US\\u000142"), "unprintable"),
    ],
)
def test_each_refusal_of_the_planning_reader_gets_its_class(data: bytes, expected: str):
    with pytest.raises(InvalidEvent) as refused:
        plan_deliberations(message(data))
    assert refusal_class(str(refused.value)) == expected
    assert expected in REFUSALS


def outcome(status: DeliberationStatus, decision_type: str = "deliberation_winner", role: str | None = "QA"):
    record = DecisionRecord(id="t:r:winner", type=decision_type, rationale="r", affected_subtask="t")
    return DeliberationOutcome(
        task_id="t",
        story_id=None,
        plan_id=None,
        status=status.value,
        winner_id=None,
        ranking=[],
        decisions=[record],
        duration_ms=42_000,
        run_id="r",
        role=role,
    )


def test_outcomes_are_counted_by_role_status_and_reason_class_and_no_id_is_a_label():
    metrics = FleetMetrics()
    metrics.outcome(outcome(DeliberationStatus.PARTIAL))
    metrics.outcome(outcome(DeliberationStatus.FAILED, "deliberation_failed", role=None))
    metrics.outcome(outcome(DeliberationStatus.FAILED, "deliberation_no_winner"))
    metrics.refused(
        PlanningRejected(
            stream="S", stream_sequence=9, subject="planning.plan.approved", reason="not JSON: x"
        )
    )
    metrics.scored(
        {
            "a": [
                {
                    "name": "tests",
                    "value": None,
                    "not_run": True,
                    "ran": "",
                    "evidence": "not_run: no isolation",
                }
            ]
        }
    )
    value = metrics.registry.get_sample_value
    assert (
        value("fleet_deliberations_total", {"role": "QA", "status": "PARTIAL", "reason": "turns_lost"}) == 1
    )
    assert (
        value("fleet_deliberations_total", {"role": "unknown", "status": "FAILED", "reason": "run_failed"})
        == 1
    )
    assert value("fleet_deliberations_total", {"role": "QA", "status": "FAILED", "reason": "no_quorum"}) == 1
    assert value("fleet_deliberation_duration_seconds_sum", {"role": "QA", "status": "PARTIAL"}) == 42
    assert value("fleet_planning_events_total", {"outcome": "refused", "reason": "not_json"}) == 1
    assert value("fleet_sandbox_runs_total", {"status": "not_run"}) == 1
    labels = {k for family in metrics.registry.collect() for s in family.samples for k in s.labels}
    assert labels <= {"role", "status", "reason", "outcome", "source", "passed", "engine", "le"}
    roles = {s.labels["role"] for f in metrics.registry.collect() for s in f.samples if "role" in s.labels}
    assert roles == {r.value for r in Role} | {"unknown"}


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        ({"name": "tests", "value": None, "evidence": "the task carries no tests"}, None),
        ({"name": "tests", "value": 0.0, "evidence": "no Python code that parses to test"}, None),
        ({"name": "tests", "value": None, "not_run": True, "evidence": "not_run: no isolation"}, "not_run"),
        (
            {"name": "tests", "value": 1.0, "ran": "python -m pytest", "evidence": "3/3 tests passed"},
            "passed",
        ),
        (
            {"name": "tests", "value": 0.5, "ran": "python -m pytest", "evidence": "1/2 tests passed"},
            "failed",
        ),
        (
            {
                "name": "tests",
                "value": 0.0,
                "ran": "run",
                "evidence": "timeout: killed after 10 s; tests unfinished",
            },
            "timeout",
        ),
        (
            {
                "name": "tests",
                "value": 0.0,
                "ran": "run",
                "evidence": "error: exit 1; tests unfinished (0 reported)",
            },
            "error",
        ),
    ],
)
def test_a_tests_checks_evidence_gives_the_sandbox_runs_status(check: dict, expected: str | None):
    assert sandbox_status(check) == expected


def test_reason_classes_of_the_statuses():
    assert reason_class(outcome(DeliberationStatus.COMPLETED)) == "none"
    assert reason_class(outcome(DeliberationStatus.TIMEOUT)) == "deadline"


def test_the_local_scrape_keeps_the_queues_series_of_ray_without_its_per_process_labels():
    config = scrape_config(
        {"fleet": "http://127.0.0.1:1/metrics", "ray": "http://127.0.0.1:2/metrics"}, 0.5, rules=None
    )
    ray = next(j for j in config["scrape_configs"] if j["job_name"] == "ray")
    assert ray["static_configs"] == [{"targets": ["127.0.0.1:2"]}]
    assert {"action": "keep", "source_labels": ["__name__"], "regex": "ray_fleet_.*"} in ray[
        "metric_relabel_configs"
    ]
    assert config["global"]["scrape_interval"] == "500ms" and "rule_files" not in config


MONITORING_DOCS = load_docs(MONITORING)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_monitoring_objects_validate_and_its_pod_is_admitted_at_restricted(version: str):
    """The core objects against the Kubernetes schemas; the exporter's pod at Pod Security
    `restricted` (the checks of test_deploy_security, from upstream's cases)."""
    core = [d for d in MONITORING_DOCS if d["apiVersion"] in ("v1", "apps/v1", "networking.k8s.io/v1")]
    assert {d["kind"] for d in core} == {"Deployment", "Service", "ConfigMap", "NetworkPolicy"}
    assert [e for d in core for e in k8s_errors(d, version)] == []
    [(owner, pod)] = workload_pods(MONITORING_DOCS)
    for policy in POLICY_VERSIONS:
        assert violations(pod, "restricted", policy) == {}, owner


def test_the_monitors_scrape_what_the_code_serves():
    """The exporter's port is `fleet metrics serve`'s; the Ray scrape relabels as the local one; the
    dashboard ConfigMap carries dashboard.json as it is."""
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in MONITORING_DOCS}
    exporter = by_kind[("Deployment", "fleet-metrics")]["spec"]["template"]["spec"]["containers"][0]
    assert exporter["command"][:3] == ["fleet", "metrics", "serve"]
    assert exporter["command"][exporter["command"].index("--port") + 1] == "9464"
    ray = by_kind[("PodMonitor", "fleet-ray")]["spec"]["podMetricsEndpoints"][0]["metricRelabelings"]
    local = scrape_config({"ray": "http://h:1/metrics"}, 1, rules=None)["scrape_configs"][0]
    assert [{k.replace("sourceLabels", "source_labels"): v for k, v in r.items()} for r in ray] == local[
        "metric_relabel_configs"
    ]
    dashboard = by_kind[("ConfigMap", "fleet-grafana-dashboard")]
    assert json.loads(dashboard["data"]["dashboard.json"]) == json.loads(
        (MONITORING / "dashboard.json").read_text()
    )
    assert dashboard["metadata"]["labels"] == {"grafana_dashboard": "1"}


def test_the_outbox_gauges_count_kept_events_and_the_oldest_batchs_age(tmp_path: Path, dagster_instance):
    outbox = Outbox(str(tmp_path / "outbox"))
    rejected = [
        rejected_event(
            PlanningRejected(stream="S", stream_sequence=n, subject="planning.plan.approved", reason="r")
        )
        for n in (1, 2, 3)
    ]
    outbox.keep("run-1", rejected[:2])
    outbox.keep("run-2", rejected[2:])
    metrics = FleetMetrics()
    exporter = FleetExporter(metrics, NatsResource(url="nats://127.0.0.1:1"), dagster_instance, outbox)
    exporter.read_outbox()
    value = metrics.registry.get_sample_value
    assert value("fleet_outbox_events") == 3
    assert 0 <= value("fleet_outbox_oldest_age_seconds") < 60
    for batch in outbox.batches():
        outbox.done(batch)
    exporter.read_outbox()
    assert value("fleet_outbox_events") == 0 and value("fleet_outbox_oldest_age_seconds") == 0
    assert value("fleet_exporter_source_up", {"source": "outbox"}) == 1


def test_the_stack_record_keeps_where_metrics_are_served(tmp_path: Path):
    where = {"fleet": "http://127.0.0.1:9464/metrics", "ray": "http://127.0.0.1:9465/metrics"}
    write_stack(tmp_path, "http://127.0.0.1:3000", {"NATS_URL": "nats://127.0.0.1:4223"}, where)
    assert read_stack(tmp_path).metrics == where


def test_a_winner_passes_its_checks_as_the_gate_says():
    metrics = FleetMetrics()
    ok = [
        {"name": "code_parses", "value": 1.0, "evidence": "parses"},
        {"name": "tests", "value": 1.0, "ran": "t", "evidence": "2/2"},
    ]
    failing = [
        {"name": "code_parses", "value": 1.0, "evidence": "parses"},
        {"name": "tests", "value": 0.5, "ran": "t", "evidence": "1/2"},
    ]
    metrics.decided("DEV", "agent-dev-001", {"agent-dev-001": ok, "agent-dev-002": failing})
    metrics.decided("DEV", "agent-dev-002", {"agent-dev-001": ok, "agent-dev-002": failing})
    metrics.decided("QA", None, {"agent-dev-001": ok})
    metrics.decided("T-17", "agent-dev-001", {"agent-dev-001": ok})  # not a role: never a label
    value = metrics.registry.get_sample_value
    assert value("fleet_deliberation_winners_total", {"role": "DEV", "passed": "true"}) == 1
    assert value("fleet_deliberation_winners_total", {"role": "DEV", "passed": "false"}) == 1
    assert value("fleet_deliberation_winners_total", {"role": "QA", "passed": "false"}) == 1
    assert value("fleet_deliberation_winners_total", {"role": "unknown", "passed": "true"}) == 1
    roles = {s.labels["role"] for f in metrics.registry.collect() for s in f.samples if "role" in s.labels}
    assert roles == {r.value for r in Role} | {"unknown"}


def test_runs_queued_and_in_flight_are_counted_per_engine_tag_as_the_run_queue_counts_them(dagster_instance):
    """Each deliberation run by its `fleet/engine` tag (the run queue's per-engine limit) and
    status; an engine whose runs are gone reads 0; other jobs' runs and ended runs are not counted."""
    statuses = dg.DagsterRunStatus

    def add(status: dg.DagsterRunStatus, engine: str | None, job: str = DELIBERATION_JOB) -> str:
        tags = {TAG_ENGINE: engine} if engine else {}
        run = dg.DagsterRun(
            job_name=job, run_id=str(uuid.uuid4()), status=status, tags=tags, remote_job_origin=ORIGIN
        )
        return dagster_instance.add_run(run).run_id

    add(statuses.QUEUED, "10.0.0.7:8000")
    add(statuses.QUEUED, "10.0.0.7:8000")
    started = add(statuses.STARTED, "10.0.0.7:8000")
    add(statuses.SUCCESS, "10.0.0.7:8000")
    vllm = add(statuses.QUEUED, "vllm-actor:Qwen2.5-7B")
    add(statuses.STARTING, None)
    add(statuses.QUEUED, "10.0.0.7:8000", job="other_job")
    metrics = FleetMetrics()
    exporter = FleetExporter(metrics, NatsResource(url="nats://127.0.0.1:1"), dagster_instance, None)
    exporter.read_dagster()
    value = metrics.registry.get_sample_value
    assert value("fleet_deliberation_runs", {"engine": "10.0.0.7:8000", "status": "queued"}) == 2
    assert value("fleet_deliberation_runs", {"engine": "10.0.0.7:8000", "status": "in_flight"}) == 1
    assert value("fleet_deliberation_runs", {"engine": "vllm-actor:Qwen2.5-7B", "status": "queued"}) == 1
    assert value("fleet_deliberation_runs", {"engine": "none", "status": "in_flight"}) == 1
    dagster_instance.delete_run(started)
    dagster_instance.delete_run(vllm)
    exporter.read_dagster()
    assert value("fleet_deliberation_runs", {"engine": "10.0.0.7:8000", "status": "in_flight"}) == 0
    assert value("fleet_deliberation_runs", {"engine": "vllm-actor:Qwen2.5-7B", "status": "queued"}) == 0
    engines = {
        s.labels["engine"] for f in metrics.registry.collect() for s in f.samples if "engine" in s.labels
    }
    assert engines == {"10.0.0.7:8000", "vllm-actor:Qwen2.5-7B", "none"}  # tags, never a run id


def test_with_nats_down_the_exporter_keeps_reading_dagster_and_says_nats_is_down(dagster_instance, capsys):
    metrics = FleetMetrics()
    closed = f"nats://127.0.0.1:{stack.free_port()}"  # nothing listens there
    exporter = FleetExporter(metrics, NatsResource(url=closed), dagster_instance, None, interval_s=0.2)

    async def run_briefly() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(1.0, stop.set)
        await exporter.run(stop)

    asyncio.run(run_briefly())
    value = metrics.registry.get_sample_value
    assert value("fleet_exporter_source_up", {"source": "nats"}) == 0
    assert value("fleet_exporter_source_up", {"source": "dagster"}) == 1
    assert capsys.readouterr().out.count("fleet metrics: nats:") == 1  # said once, not at every read
