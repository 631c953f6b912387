"""The production Dagster instance: deploy/dagster.yaml validates against Dagster's own config
schemas (instance, dagster-k8s K8sRunLauncher, QueuedRunCoordinator, dagster-postgres), and the
Helm values render to that same instance (the chart's camelCase to snake_case mapping, done
here as a pure function), so the two deployment routes cannot drift apart."""

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

ROOT = Path(__file__).resolve().parents[2]
INSTANCE = yaml.safe_load((ROOT / "deploy" / "dagster.yaml").read_text())
VALUES = yaml.safe_load((ROOT / "deploy" / "helm" / "dagster-values.yaml").read_text())
NATS_VALUES = yaml.safe_load((ROOT / "deploy" / "helm" / "nats-values.yaml").read_text())
SECRETS = {
    d["metadata"]["name"]: d["stringData"]
    for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "secrets.yaml").read_text())
}


def snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


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
            "env_config_maps": [r["name"] for r in launcher["envConfigMaps"]],
            "env_secrets": [r["name"] for r in launcher["envSecrets"]],
            "run_k8s_config": {
                "container_config": k8s_config["container_config"],
                "job_spec_config": k8s_config["job_spec_config"],
            },
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
    shutil.copy(ROOT / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
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


def test_run_container_config_is_a_valid_kubernetes_container():
    container = {
        "name": "run",
        "image": "x",
        **INSTANCE["run_launcher"]["config"]["run_k8s_config"]["container_config"],
    }
    pod = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "run"},
        "template": {"spec": {"containers": [container]}},
    }
    kubernetes_validate.validate(pod, "1.33", strict=True)


def test_helm_values_match_the_chart_schema():
    schema = yaml.safe_load((Path(__file__).parent / "schemas" / "dagster-values.schema.yaml").read_text())
    jsonschema.Draft202012Validator(schema).validate(VALUES)
    with pytest.raises(jsonschema.ValidationError, match="maxConcurrentRun"):
        typo = yaml.safe_load(yaml.safe_dump(VALUES))
        queued = typo["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
        queued["maxConcurrentRun"] = queued.pop("maxConcurrentRuns")
        jsonschema.Draft202012Validator(schema).validate(typo)


def test_helm_values_render_the_same_instance_as_the_instance_file():
    rendered = render_instance(VALUES)
    for key, value in rendered["run_launcher"].items():
        assert INSTANCE["run_launcher"]["config"][key] == value, key
    assert rendered["run_coordinator"] == INSTANCE["run_coordinator"]["config"]
    assert rendered["sensors"] == INSTANCE["sensors"]
    assert rendered["schedules"] == INSTANCE["schedules"]
    assert (
        errors(
            K8sRunLauncher.config_type(), {**INSTANCE["run_launcher"]["config"], **rendered["run_launcher"]}
        )
        == []
    )


def test_user_code_deployment_serves_our_code_location_with_postgres_storage():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (deployment,) = VALUES["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("--module-name") + 1] == pyproject["tool"]["dagster"]["module_name"]
    assert deployment["image"]["tag"] == pyproject["project"]["version"]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"]
    assert VALUES["runLauncher"]["type"] == "K8sRunLauncher"
    assert VALUES["postgresql"]["enabled"] is False and VALUES["generatePostgresqlPasswordSecret"] is False
    # With no generated secret, the chart reads the password from this Secret.
    assert "postgresql-password" in SECRETS[VALUES["global"]["postgresqlSecretName"]]
    for ref in deployment["envSecrets"]:
        assert ref["name"] in SECRETS


def test_nats_values_enable_jetstream_with_the_platform_user():
    config = NATS_VALUES["config"]
    assert config["jetstream"]["enabled"] and config["jetstream"]["fileStore"]["enabled"]
    assert config["cluster"]["replicas"] >= 3  # a JetStream R3 stream needs three servers
    secret_ref = NATS_VALUES["container"]["env"]["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert secret_ref["key"] in SECRETS[secret_ref["name"]]
    (user,) = config["merge"]["accounts"]["FLEET"]["users"]
    assert user["user"] == SECRETS["fleet-nats"]["NATS_USER"]
