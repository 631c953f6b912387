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
    chart_container_context,
    chart_pods,
    chart_run_job,
    chart_run_launcher,
    chart_storage,
    documented_secrets,
    helm_install_versions,
    instance_run_job,
    load_docs,
    nats_pods,
    of_kind,
    snake,
)

SCHEMAS = Path(__file__).parent / "schemas"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
IMAGE = "registry.example.com/fleet-pipelines"


def render_instance(values: dict[str, Any]) -> dict[str, Any]:
    """The instance sections the Dagster chart renders from our values (chart helpers
    `_run-coordinator.tpl`, `_run-launcher.tpl`, `_compute-log-manager.tpl`, `_sensors.tpl`, and
    templates/configmap-instance.yaml for run_monitoring): keys snake_cased one level down, named
    references flattened to names."""
    queued = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    daemon = values["dagsterDaemon"]
    logs = values["computeLogManager"]
    assert logs["type"] == "S3ComputeLogManager"
    return {
        "run_launcher": chart_run_launcher(values),
        "run_coordinator": {snake(k): v for k, v in queued.items()},
        "run_monitoring": {snake(k): v for k, v in daemon["runMonitoring"].items()},
        "compute_logs": {
            "module": "dagster_aws.s3.compute_log_manager",
            "class": "S3ComputeLogManager",
            "config": {snake(k): v for k, v in logs["config"]["s3ComputeLogManager"].items()},
        },
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
    assert pod["hostUsers"] is False and "procMount" not in pod["containers"][0]["securityContext"]


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
    for key in ("job_namespace", "dagster_home", "env_secrets", "run_k8s_config", "image_pull_policy"):
        assert (rendered["run_launcher"].get(key) or None) == (launcher.get(key) or None), key
    for section in ("run_monitoring", "compute_logs"):
        assert rendered[section] == INSTANCE[section], section
    # The chart route also needs no dagster-pg ConfigMap: it writes host, user and db literally.
    assert [*VALUES["runLauncher"]["config"]["k8sRunLauncher"]["envConfigMaps"], {"name": "dagster-pg"}] == [
        {"name": n} for n in launcher["env_config_maps"]
    ]
    assert rendered["run_coordinator"] == INSTANCE["run_coordinator"]["config"]
    assert rendered["sensors"] == INSTANCE["sensors"]
    assert rendered["schedules"] == INSTANCE["schedules"]
    assert errors(K8sRunLauncher.config_type(), rendered["run_launcher"]) == []


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
    # Run pods take their settings from the run launcher only (see the resources test below).
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is False
    assert VALUES["runLauncher"]["type"] == "K8sRunLauncher"
    assert VALUES["postgresql"]["enabled"] is False and VALUES["generatePostgresqlPasswordSecret"] is False
    secrets = documented_secrets()
    # With no generated secret, the chart reads the password from this Secret.
    assert "postgresql-password" in secrets[VALUES["global"]["postgresqlSecretName"]]
    for ref in deployment.get("envSecrets", []):
        assert ref["name"] in secrets
    for volume in deployment["volumes"]:
        assert "secret" not in volume or volume["secret"]["secretName"] in secrets


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


# --- run-pod resources, run monitoring, compute logs, the instance file ----------------------------


def run_resources(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container["resources"]


@pytest.mark.parametrize("route", ["instance", "chart"])
def test_run_pods_get_the_run_launchers_resources(route: str):
    """The Job dagster-k8s's K8sRunLauncher submits (its own launch_run: the launcher's settings
    merged with the code location's container context and the run's tags) has the resources we
    set for runs, not the code server's: they bound every sandbox of the run."""
    job = instance_run_job() if route == "instance" else chart_run_job(VALUES)
    wanted = INSTANCE["run_launcher"]["config"]["run_k8s_config"]["container_config"]["resources"]
    assert run_resources(job) == wanted
    assert wanted["limits"] == {"cpu": "2", "memory": "4Gi"}
    (code_server,) = VALUES["dagster-user-deployments"]["deployments"]
    assert code_server["resources"] != wanted


def test_with_the_code_servers_config_in_launched_runs_its_resources_would_win():
    """Why includeConfigInLaunchedRuns is off: on, the chart reports the code server's resources as
    its container context, and dagster-k8s's merge puts them over the run launcher's."""
    assert chart_container_context(VALUES) is None
    values = yaml.safe_load(yaml.safe_dump(VALUES))
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    deployment["includeConfigInLaunchedRuns"]["enabled"] = True
    assert chart_container_context(values)["k8s"]["resources"] == deployment["resources"]
    assert run_resources(chart_run_job(values)) == deployment["resources"]


@pytest.mark.parametrize("route", ["instance", "chart"])
def test_run_pods_get_the_platforms_settings_without_the_code_servers_context(route: str):
    """With no container context the launcher alone must give run pods the settings, the secrets,
    the instance and the image of the code location."""
    job = instance_run_job() if route == "instance" else chart_run_job(VALUES)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    sources = {(kind, ref["name"]) for source in container["envFrom"] for kind, ref in source.items()}
    assert ("configMapRef", "fleet-config") in sources
    # Every Secret as files (the push token and remote only here), none as a variable but
    # Dagster's PostgreSQL password (below).
    assert not any(kind == "secretRef" for kind, _ in sources)
    mounted = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert mounted == {"fleet-s3", "fleet-ray-token", "fleet-llm", "fleet-nats", "fleet-git"}
    assert container["image"] == f"{IMAGE}:{PYPROJECT['project']['version']}"
    assert job["metadata"]["namespace"] == "fleet"
    assert pod["serviceAccountName"] == "fleet-workload" and pod["automountServiceAccountToken"] is False
    # The instance travels in the run's command (dagster-k8s mounts no instance file in run pods);
    # its PostgreSQL password from the Secret the launcher names.
    assert '"instance_ref"' in container["args"][-1]
    (password,) = [e for e in container["env"] if e["name"] == "DAGSTER_PG_PASSWORD"]
    assert password["valueFrom"]["secretKeyRef"]["name"] == "dagster-postgresql-secret"


def test_both_routes_monitor_runs_with_a_start_timeout_and_resume_attempts():
    """Dagster leaves run monitoring off: a run whose pod never starts would stay STARTING and hold
    its queue slot. Both routes enable it (the chart renders dagsterDaemon.runMonitoring);
    tests/integration/test_run_monitoring.py runs it on a local instance."""
    monitoring = INSTANCE["run_monitoring"]
    assert monitoring["enabled"] is True
    assert 60 <= monitoring["start_timeout_seconds"] <= 600  # minutes, not never
    assert monitoring["max_resume_run_attempts"] >= 1
    assert monitoring["poll_interval_seconds"] < monitoring["start_timeout_seconds"]
    assert render_instance(VALUES)["run_monitoring"] == monitoring
    # Resume attempts need a launcher that can resume (Dagster refuses the instance otherwise).
    assert K8sRunLauncher.supports_resume_run.fget(None) is True  # type: ignore[attr-defined]
    with pytest.raises(jsonschema.ValidationError, match="startTimeoutSecond"):
        typo = yaml.safe_load(yaml.safe_dump(VALUES))
        run_monitoring = typo["dagsterDaemon"]["runMonitoring"]
        run_monitoring["startTimeoutSecond"] = run_monitoring.pop("startTimeoutSeconds")
        schema = yaml.safe_load((SCHEMAS / "dagster-values.schema.yaml").read_text())
        jsonschema.Draft202012Validator(schema).validate(typo)


def test_compute_logs_go_to_the_platforms_bucket_through_dagster_aws():
    from dagster_aws.s3.compute_log_manager import S3ComputeLogManager

    logs = INSTANCE["compute_logs"]
    assert (logs["module"], logs["class"]) == ("dagster_aws.s3.compute_log_manager", "S3ComputeLogManager")
    assert errors(S3ComputeLogManager.config_type(), logs["config"]) == []
    (fleet_config,) = [d for d in load_docs(K8S) if d["metadata"]["name"] == "fleet-config"]
    bucket = fleet_config["data"]["FLEET_STORAGE_PATH"].removeprefix("s3://").split("/")[0]
    assert logs["config"]["bucket"] == bucket
    # dagster-aws is installed with dagster-k8s, at the Dagster release's integration version.
    extra = PYPROJECT["project"]["optional-dependencies"]["k8s"]
    k8s_pin = next(p for p in extra if p.startswith("dagster-k8s=="))
    assert f"dagster-aws=={k8s_pin.split('==')[1]}" in extra
    # Whoever writes or shows the logs has the bucket's credentials file (botocore's
    # AWS_SHARED_CREDENTIALS_FILE, the fleet-s3 Secret mounted there).
    credentials = {"name": "AWS_SHARED_CREDENTIALS_FILE", "value": "/var/run/secrets/fleet/s3/credentials"}
    s3_volume = {"name": "s3", "secret": {"secretName": "fleet-s3", "defaultMode": 0o440}}
    s3_mount = {"name": "s3", "mountPath": "/var/run/secrets/fleet/s3", "readOnly": True}
    for component in (VALUES["dagsterWebserver"], VALUES["dagsterDaemon"]):
        assert credentials in component["env"] and s3_volume in component["volumes"]
        assert s3_mount in component["volumeMounts"]
    for name in ("dagster-webserver", "dagster-daemon", "fleet-pipelines"):
        (deployment,) = [
            d for d in of_kind(load_docs(DAGSTER_DIR), "Deployment") if d["metadata"]["name"] == name
        ]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert credentials in container["env"] and s3_mount in container["volumeMounts"], name
    run = INSTANCE["run_launcher"]["config"]["run_k8s_config"]
    assert credentials in run["container_config"]["env"] and s3_volume in run["pod_spec_config"]["volumes"]


def test_the_instance_file_is_mounted_wherever_fleet_runs():
    """`fleet result` / `fleet deliberate` in the code-server pod use the production instance
    (without it, a local SQLite one): the code server mounts the same ConfigMap the run pods get."""
    home = INSTANCE["run_launcher"]["config"]["dagster_home"]
    config_map = INSTANCE["run_launcher"]["config"]["instance_config_map"]
    (deployment,) = [
        d for d in of_kind(load_docs(DAGSTER_DIR), "Deployment") if d["metadata"]["name"] == "fleet-pipelines"
    ]
    pod = deployment["spec"]["template"]["spec"]
    for mounts, volumes in (
        (pod["containers"][0]["volumeMounts"], pod["volumes"]),
        (
            VALUES["dagster-user-deployments"]["deployments"][0]["volumeMounts"],
            VALUES["dagster-user-deployments"]["deployments"][0]["volumes"],
        ),
    ):
        (mount,) = [m for m in mounts if m["mountPath"] == f"{home}/dagster.yaml"]
        assert mount["subPath"] == "dagster.yaml"
        (volume,) = [v for v in volumes if v["name"] == mount["name"]]
        assert volume["configMap"]["name"] == config_map == chart_run_launcher(VALUES)["instance_config_map"]
