"""The production Dagster instance and the chart values: deploy/dagster/dagster.yaml validates
against Dagster's own config schemas (instance, dagster-k8s K8sRunLauncher, QueuedRunCoordinator,
dagster-postgres); the Helm values validate against schemas of the pinned charts (Dagster 1.13.27,
NATS 2.14.2) and render the same instance (the chart's camelCase to snake_case mapping, done here
as pure functions), so the two deployment routes cannot drift apart. The rendered storage is
loaded against a real PostgreSQL in tests/integration/test_postgres_storage.py."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from dagster._config import validate_config
from dagster._core.instance.config import dagster_instance_config
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster_k8s import K8sRunLauncher
from dagster_postgres import DagsterPostgresStorage

from .deploy_objects import (
    DAGSTER_CHART,
    DAGSTER_DIR,
    INSTANCE,
    K8S,
    KUBERAY_OPERATOR,
    NATS_CHART,
    NATS_VALUES,
    ROOT,
    VALUES,
    chart_pods,
    chart_run_job,
    chart_storage,
    documented_secrets,
    helm_install_versions,
    instance_run_job,
    load_docs,
    nats_pods,
    snake,
)

SCHEMAS = Path(__file__).parent / "schemas"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
IMAGE = "registry.example.com/fleet-pipelines"


def render_instance(values: dict[str, Any]) -> dict[str, Any]:
    """The instance sections the Dagster chart renders from our values (chart helpers
    `_run-coordinator.tpl`, `_run-launcher.tpl`, `_sensors.tpl`): keys snake_cased one level down,
    named references flattened to names."""
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    k8s_config = {snake(k): v for k, v in launcher["runK8sConfig"].items()}
    queued = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    daemon = values["dagsterDaemon"]
    return {
        "run_launcher": {
            "job_namespace": launcher["jobNamespace"],
            "env_secrets": [r["name"] for r in launcher["envSecrets"]],
            "run_k8s_config": k8s_config,
            "dagster_home": values["global"]["dagsterHome"],
        },
        "run_coordinator": {snake(k): v for k, v in queued.items()},
        "sensors": {snake(k): v for k, v in daemon["sensors"].items()},
        "schedules": {snake(k): v for k, v in daemon["schedules"].items()},
    }


def errors(config_type: Any, value: Any) -> list[str]:
    result = validate_config(config_type, value)
    return [] if result.success else [e.message for e in result.errors]


def test_instance_file_loads_with_dagsters_instance_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in ("DAGSTER_PG_HOST", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB"):
        monkeypatch.setenv(name, "set-by-the-pod")
    shutil.copy(DAGSTER_DIR / "dagster.yaml", tmp_path / "dagster.yaml")
    config, _ = dagster_instance_config(str(tmp_path))
    assert set(config) >= {"storage", "run_launcher", "run_coordinator", "sensors"}


def test_each_instance_class_accepts_its_config():
    assert INSTANCE["run_launcher"]["class"] == "K8sRunLauncher"
    assert errors(K8sRunLauncher.config_type(), INSTANCE["run_launcher"]["config"]) == []
    assert errors(QueuedRunCoordinator.config_type(), INSTANCE["run_coordinator"]["config"]) == []
    assert errors(DagsterPostgresStorage.config_type(), INSTANCE["storage"]["postgres"]) == []
    # Credentials come from the environment, never from the file.
    pg = INSTANCE["storage"]["postgres"]["postgres_db"]
    assert all(isinstance(pg[k], dict) and "env" in pg[k] for k in ("hostname", "username", "password"))


def test_config_validation_rejects_a_typo():
    typo = {**INSTANCE["run_launcher"]["config"], "job_namespce": "fleet"}
    assert any("job_namespce" in e for e in errors(K8sRunLauncher.config_type(), typo))


@pytest.mark.parametrize("version", ["1.33", "1.37"])
@pytest.mark.parametrize("route", ["instance", "chart"])
def test_the_run_job_dagster_k8s_builds_is_valid_kubernetes(route: str, version: str):
    """dagster-k8s turns our run_k8s_config into the Job it submits; that Job validates (strict)."""
    job = instance_run_job() if route == "instance" else chart_run_job(VALUES)
    job["metadata"].pop("creationTimestamp", None)
    kubernetes_validate.validate(job, version, strict=True)
    pod = job["spec"]["template"]["spec"]
    assert pod["hostUsers"] is False and pod["containers"][0]["securityContext"]["procMount"] == "Unmasked"


@pytest.mark.parametrize(("owner", "pod"), chart_pods(VALUES) + nats_pods(NATS_VALUES))
def test_chart_pod_settings_are_valid_kubernetes(owner: str, pod: dict[str, Any]):
    """The securityContexts and ports our values put into the charts' pods, against the
    Kubernetes PodSpec schema (strict)."""
    spec = {**pod}
    for key in ("initContainers", "containers"):
        if key in spec:
            spec[key] = [{"image": "x", **{k: v for k, v in c.items() if v is not None}} for c in spec[key]]
    template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "p"},
        "template": {"spec": spec},
    }
    kubernetes_validate.validate(template, "1.33", strict=True)


def test_helm_values_match_the_chart_schema():
    schema = yaml.safe_load((SCHEMAS / "dagster-values.schema.yaml").read_text())
    assert DAGSTER_CHART in schema_header("dagster-values.schema.yaml")
    jsonschema.Draft202012Validator(schema).validate(VALUES)
    with pytest.raises(jsonschema.ValidationError, match="maxConcurrentRun"):
        typo = yaml.safe_load(yaml.safe_dump(VALUES))
        queued = typo["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
        queued["maxConcurrentRun"] = queued.pop("maxConcurrentRuns")
        jsonschema.Draft202012Validator(schema).validate(typo)
    with pytest.raises(jsonschema.ValidationError, match="postgresqlSchema"):
        typo = yaml.safe_load(yaml.safe_dump(VALUES))
        typo["postgresql"]["postgresqlSchema"] = typo["postgresql"].pop("postgresqlScheme")
        jsonschema.Draft202012Validator(schema).validate(typo)


def schema_header(name: str) -> str:
    return (SCHEMAS / name).read_text().split("\n$schema", 1)[0]


def test_helm_values_render_the_same_instance_as_the_instance_file():
    rendered = render_instance(VALUES)
    launcher = INSTANCE["run_launcher"]["config"]
    assert rendered["run_launcher"]["job_namespace"] == launcher["job_namespace"]
    assert rendered["run_launcher"]["dagster_home"] == launcher["dagster_home"]
    assert rendered["run_launcher"]["env_secrets"] == launcher["env_secrets"]
    assert rendered["run_launcher"]["run_k8s_config"] == launcher["run_k8s_config"]
    # The chart route also needs no dagster-pg ConfigMap: it writes host, user and db literally.
    assert [*VALUES["runLauncher"]["config"]["k8sRunLauncher"]["envConfigMaps"], {"name": "dagster-pg"}] == [
        {"name": n} for n in launcher["env_config_maps"]
    ]
    assert rendered["run_coordinator"] == INSTANCE["run_coordinator"]["config"]
    assert rendered["sensors"] == INSTANCE["sensors"]
    assert rendered["schedules"] == INSTANCE["schedules"]
    assert errors(K8sRunLauncher.config_type(), {**launcher, **rendered["run_launcher"]}) == []


def test_both_routes_store_through_psycopg2():
    """SQLAlchemy 2.x maps a plain postgresql:// URL to psycopg 3; the image has psycopg2 only."""
    assert INSTANCE["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
    for storage in chart_storage(VALUES).values():
        assert storage["config"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
        assert errors(DagsterPostgresStorage.config_type(), storage["config"]) == []


def test_dagster_home_is_the_images_writable_home():
    (home,) = re.findall(r"DAGSTER_HOME=(\S+)", (ROOT / "deploy" / "Dockerfile").read_text())
    assert VALUES["global"]["dagsterHome"] == home == INSTANCE["run_launcher"]["config"]["dagster_home"]


def test_user_code_deployment_serves_our_code_location_with_postgres_storage():
    (deployment,) = VALUES["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("--module-name") + 1] == PYPROJECT["tool"]["dagster"]["module_name"]
    for image in (deployment["image"], VALUES["dagsterWebserver"]["image"], VALUES["dagsterDaemon"]["image"]):
        assert (image["repository"], image["tag"]) == (IMAGE, PYPROJECT["project"]["version"])
    assert deployment["includeConfigInLaunchedRuns"]["enabled"]
    assert VALUES["runLauncher"]["type"] == "K8sRunLauncher"
    assert VALUES["postgresql"]["enabled"] is False and VALUES["generatePostgresqlPasswordSecret"] is False
    secrets = documented_secrets()
    # With no generated secret, the chart reads the password from this Secret.
    assert "postgresql-password" in secrets[VALUES["global"]["postgresqlSecretName"]]
    for ref in deployment["envSecrets"]:
        assert ref["name"] in secrets


def test_readme_pins_the_chart_and_operator_versions_these_tests_are_written_for():
    dagster_pin = next(p for p in PYPROJECT["project"]["dependencies"] if p.startswith("dagster=="))
    assert dagster_pin == f"dagster=={DAGSTER_CHART}"
    # KubeRay before 1.6 probes with wget (not in the image) whatever the Ray version.
    assert tuple(int(x) for x in KUBERAY_OPERATOR.split(".")[:2]) >= (1, 6)
    assert helm_install_versions() == {
        "dagster/dagster": DAGSTER_CHART,
        "nats/nats": NATS_CHART,
        "kuberay/kuberay-operator": KUBERAY_OPERATOR,
    }
    for values_file, version in (("dagster-values.yaml", DAGSTER_CHART), ("nats-values.yaml", NATS_CHART)):
        assert f"--version {version}" in (ROOT / "deploy" / "helm" / values_file).read_text()


def test_nats_values_match_the_chart_schema_and_enable_jetstream_with_the_platform_user():
    schema = yaml.safe_load((SCHEMAS / "nats-values.schema.yaml").read_text())
    assert NATS_CHART in schema_header("nats-values.schema.yaml")
    jsonschema.Draft202012Validator(schema).validate(NATS_VALUES)
    config = NATS_VALUES["config"]
    assert config["jetstream"]["enabled"] and config["jetstream"]["fileStore"]["enabled"]
    assert config["cluster"]["enabled"] and config["cluster"]["replicas"] >= 3  # R3 streams need three
    # Streams get one replica per server (fleet nats init and every client read FLEET_NATS_REPLICAS).
    (fleet_config,) = [d for d in load_docs(K8S) if d["kind"] == "ConfigMap"]
    assert int(fleet_config["data"]["FLEET_NATS_REPLICAS"]) == config["cluster"]["replicas"]
    secret_ref = NATS_VALUES["container"]["env"]["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert secret_ref["key"] in documented_secrets()[secret_ref["name"]]
    (user,) = config["merge"]["accounts"]["FLEET"]["users"]
    assert user["user"] == "fleet"
    assert "--from-literal=NATS_USER=fleet" in (ROOT / "deploy" / "README.md").read_text()
    with pytest.raises(jsonschema.ValidationError):
        old = yaml.safe_load(yaml.safe_dump(NATS_VALUES))
        old["cluster"] = old.pop("config")["cluster"]  # chart 0.x layout
        jsonschema.Draft202012Validator(schema).validate(old)
