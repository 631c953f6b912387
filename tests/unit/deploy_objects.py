"""What deploy/ would create, read offline for the deploy tests: the plain manifests of each
route, the pods the Dagster and NATS charts render from our values (pure functions written from
the chart templates at the pinned versions), the Secrets deploy/README.md tells operators to
create, and the instance config the Dagster chart renders."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DAGSTER_DIR = DEPLOY / "dagster"
README = (DEPLOY / "README.md").read_text()

# The versions deploy/README.md pins; the chart-value schemas and render functions below are
# written from these releases.
DAGSTER_CHART = "1.13.27"
NATS_CHART = "2.14.2"
KUBERAY_OPERATOR = "1.7.0"


class StrictLoader(yaml.SafeLoader):
    """YAML as Kubernetes and Helm read it: a key given twice in one mapping is an error (PyYAML
    would keep the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        duplicates = {k for k in keys if keys.count(k) > 1}
        if duplicates:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate keys {sorted(duplicates)}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    return yaml.load(text, Loader=StrictLoader)


def load_all(text: str) -> list[Any]:
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d]


INSTANCE = load((DAGSTER_DIR / "dagster.yaml").read_text())
VALUES = load((DEPLOY / "helm" / "dagster-values.yaml").read_text())
NATS_VALUES = load((DEPLOY / "helm" / "nats-values.yaml").read_text())

Pod = dict[str, Any]  # a PodSpec


def load_docs(directory: Path) -> list[dict[str, Any]]:
    """Every object of a kustomization: its resources and its generated ConfigMaps."""
    kustomization = load((directory / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += load_all((directory / name).read_text())
    for generator in kustomization.get("configMapGenerator", []):
        data = {Path(f).name: (directory / f).read_text() for f in generator["files"]}
        docs.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        )
    return docs


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def raycluster() -> dict[str, Any]:
    (cluster,) = of_kind(load_docs(K8S), "RayCluster")
    return cluster


def workload_pods(docs: list[dict[str, Any]]) -> list[tuple[str, Pod]]:
    """(owner, pod spec) of every Deployment, Job and RayCluster group, with the containers the
    KubeRay operator adds: the autoscaler beside the head (autoscalerOptions.securityContext) and
    the wait-gcs-ready init container of each worker (a copy of the Ray container's
    securityContext; operator v1.7.0, ray-operator/controllers/ray/common/pod.go)."""
    pods = [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("Deployment", "Job")
    ]
    for cluster in of_kind(docs, "RayCluster"):
        spec = cluster["spec"]
        head = copy.deepcopy(spec["headGroupSpec"]["template"]["spec"])
        if spec.get("enableInTreeAutoscaling"):
            options = spec.get("autoscalerOptions", {})
            head["containers"].append(
                {"name": "autoscaler", **{k: options[k] for k in ("securityContext",) if k in options}}
            )
        pods.append(("RayCluster/head", head))
        for group in spec["workerGroupSpecs"]:
            worker = copy.deepcopy(group["template"]["spec"])
            ray_container = worker["containers"][0]
            wait = {
                "name": "wait-gcs-ready",
                "securityContext": copy.deepcopy(ray_container.get("securityContext")),
            }
            worker["initContainers"] = [*worker.get("initContainers", []), wait]
            pods.append((f"RayCluster/{group['groupName']}", worker))
    return pods


def containers(pod: Pod) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


# --- the Dagster chart (1.13.27) rendered from our values ------------------------------------------


def chart_storage(values: dict[str, Any]) -> dict[str, Any]:
    """The storage sections of the instance ConfigMap (templates/configmap-instance.yaml with
    helpers/instance/_postgresql.tpl): three dagster-postgres storages sharing one postgres_db."""
    pg = values["postgresql"]
    postgres_db = {
        "username": pg["postgresqlUsername"],
        "password": {"env": "DAGSTER_PG_PASSWORD"},
        "hostname": pg["postgresqlHost"],  # postgresql.enabled is false: the external host
        "db_name": pg["postgresqlDatabase"],
        "port": pg["service"]["port"],
        "params": pg.get("postgresqlParams", {}),
    }
    if pg.get("postgresqlScheme"):
        postgres_db["scheme"] = pg["postgresqlScheme"]
    return {
        f"{kind}_storage": {
            "module": f"dagster_postgres.{module}",
            "class": cls,
            "config": {"postgres_db": dict(postgres_db)},
        }
        for kind, module, cls in (
            ("run", "run_storage", "PostgresRunStorage"),
            ("event_log", "event_log", "PostgresEventLogStorage"),
            ("schedule", "schedule_storage", "PostgresScheduleStorage"),
        )
    }


def chart_pods(values: dict[str, Any]) -> list[tuple[str, Pod]]:
    """The pods the chart creates and the run pods the K8sRunLauncher starts, as far as security
    and ports go: the webserver and daemon Deployments (with the check-db-ready and
    init-user-deployment-* init containers, which take the component's securityContext), the
    user-code Deployments, and the run pod dagster-k8s builds from runK8sConfig."""
    pods = []
    user = values["dagster-user-deployments"]
    for owner, component in (("webserver", values["dagsterWebserver"]), ("daemon", values["dagsterDaemon"])):
        init = [{"name": "check-db-ready", "securityContext": component.get("securityContext")}]
        if owner == "webserver":
            init += [
                {
                    "name": f"init-user-deployment-{d['name']}",
                    "securityContext": component.get("securityContext"),
                }
                for d in user["deployments"]
            ]
        main = {"name": "dagster", "securityContext": component.get("securityContext")}
        if owner == "webserver":
            main["ports"] = [{"name": "http", "containerPort": component.get("service", {}).get("port", 80)}]
        pods.append(
            (
                f"chart/{owner}",
                {
                    "securityContext": component.get("podSecurityContext", {}),
                    "initContainers": init,
                    "containers": [main],
                },
            )
        )
    for d in user["deployments"]:
        pods.append(
            (
                f"chart/user-deployment/{d['name']}",
                {
                    "securityContext": d.get("podSecurityContext", {}),
                    "containers": [
                        {
                            "name": "dagster",
                            "securityContext": d.get("securityContext"),
                            "ports": [{"containerPort": d["port"]}],
                        }
                    ],
                },
            )
        )
    pods.append(("chart/run", chart_run_job(values)["spec"]["template"]["spec"]))
    return pods


def snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def launched_run_job(
    run_k8s_config: dict[str, Any], env_config_maps: list[str], env_secrets: list[str]
) -> dict[str, Any]:
    """The Job dagster-k8s's K8sRunLauncher submits for a run, built by dagster-k8s itself
    (construct_dagster_k8s_job) from a run launcher's settings, as Kubernetes JSON."""
    import kubernetes
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

    job_config = DagsterK8sJobConfig(
        job_image="registry.example.com/fleet-pipelines:0.1.0",
        dagster_home=INSTANCE["run_launcher"]["config"]["dagster_home"],
        instance_config_map="dagster-instance",
        postgres_password_secret="dagster-postgresql-secret",
        env_config_maps=env_config_maps,
        env_secrets=env_secrets,
    )
    job = construct_dagster_k8s_job(
        job_config,
        ["dagster", "api", "execute_run", "{}"],
        "dagster-run-0",
        UserDefinedDagsterK8sConfig.from_dict(run_k8s_config),
    )
    return kubernetes.client.ApiClient().sanitize_for_serialization(job)


def instance_run_job() -> dict[str, Any]:
    """The run Job of deploy/dagster/dagster.yaml's K8sRunLauncher."""
    config = INSTANCE["run_launcher"]["config"]
    return launched_run_job(config["run_k8s_config"], config["env_config_maps"], config["env_secrets"])


def chart_run_job(values: dict[str, Any]) -> dict[str, Any]:
    """The run Job of the chart's K8sRunLauncher (runK8sConfig keys snake_cased by the chart's
    _run-launcher.tpl), with the user deployment's config maps and secrets merged in
    (includeConfigInLaunchedRuns)."""
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    (user,) = values["dagster-user-deployments"]["deployments"]
    config_maps = [r["name"] for r in [*launcher["envConfigMaps"], *user["envConfigMaps"]]]
    secrets = [r["name"] for r in [*launcher["envSecrets"], *user["envSecrets"]]]
    run_k8s_config = {snake(k): v for k, v in launcher["runK8sConfig"].items()}
    return launched_run_job(run_k8s_config, list(dict.fromkeys(config_maps)), list(dict.fromkeys(secrets)))


def nats_pods(values: dict[str, Any]) -> list[tuple[str, Pod]]:
    """The NATS StatefulSet pod (chart 2.14.2, files/stateful-set/pod-template.yaml): the nats
    container, the config reloader when enabled, merged with our `merge` values; and nats-box
    when enabled."""
    spec = copy.deepcopy(values.get("podTemplate", {}).get("merge", {}).get("spec", {}))
    spec["containers"] = [{"name": "nats", **values.get("container", {}).get("merge", {})}]
    if values.get("reloader", {}).get("enabled", True):
        spec["containers"].append({"name": "reloader", **values.get("reloader", {}).get("merge", {})})
    pods = [("chart/nats", spec)]
    box = values.get("natsBox", {})
    if box.get("enabled", True):
        box_spec = copy.deepcopy(box.get("podTemplate", {}).get("merge", {}).get("spec", {}))
        box_spec["containers"] = [{"name": "nats-box", **box.get("container", {}).get("merge", {})}]
        pods.append(("chart/nats-box", box_spec))
    return pods


# --- deploy/README.md -------------------------------------------------------------------------------


def documented_secrets() -> dict[str, set[str]]:
    """Secret name -> keys, from the `kubectl create secret generic` commands of deploy/README.md."""
    joined = re.sub(r"\\\n\s*", " ", README)
    secrets: dict[str, set[str]] = {}
    for line in joined.splitlines():
        line = line.strip()
        if "create secret generic" not in line:
            continue
        words = shlex.split(line.split("create secret generic", 1)[1], comments=True)
        keys = {w.split("=", 2)[1] for w in words if w.startswith(("--from-literal=", "--from-file="))}
        secrets.setdefault(words[0], set()).update(keys)
    return secrets


def helm_install_versions() -> dict[str, str]:
    """Chart -> version of each `helm upgrade --install` in deploy/README.md."""
    joined = re.sub(r"\\\n\s*", " ", README)
    found = {}
    for match in re.finditer(r"helm upgrade --install \S+ (\S+) .*?--version (\S+)", joined):
        found[match.group(1)] = match.group(2)
    return found
