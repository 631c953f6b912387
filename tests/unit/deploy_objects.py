"""What deploy/ would create, read offline for the deploy tests: the plain manifests of each
route, the pods the Dagster and NATS charts render from our values (pure functions written from
the chart templates at the pinned versions), the Secrets deploy/README.md tells operators to
create, and the instance config the Dagster chart renders."""

from __future__ import annotations

import copy
import functools
import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DAGSTER_DIR = DEPLOY / "dagster"
NODE_DIR = DEPLOY / "node"
README = (DEPLOY / "README.md").read_text()

# The versions deploy/README.md pins; the chart-value schemas and render functions below are
# written from these releases.
DAGSTER_CHART = "1.13.27"
NATS_CHART = "2.14.2"
KUBERAY_OPERATOR = "1.7.0"
IMAGE_TAG = "0.1.0"


FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser: ~10x faster


class StrictLoader(FAST_LOADER):
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

# The flow table (deploy/flows.yaml) and the operator's address list filled in as its example.
FLOW_TABLE = load((DEPLOY / "flows.yaml").read_text())
EGRESS_EXAMPLE = load_all((DEPLOY / "egress.example.yaml").read_text())

Pod = dict[str, Any]  # a PodSpec


def parse_ports(ports: list[str] | str) -> set[tuple[str, int]] | None:
    """["TCP 443", "UDP 53"] as {(protocol, port)}; "every port" as None."""
    if ports == "every port":
        return None
    return {(p.split()[0], int(p.split()[1])) for p in ports}


def table_rows() -> list[tuple[set[str], set[str], set[tuple[str, int]] | None]]:
    """(from components, to components, (protocol, port) set or None for every port) of each flow
    of deploy/flows.yaml."""
    return [(set(f["from"]), set(f["to"]), parse_ports(f["ports"])) for f in FLOW_TABLE["flows"]]


def load_docs(directory: Path) -> list[dict[str, Any]]:
    """Every object of a kustomization: its resources and its generated ConfigMaps (a copy the
    caller may change; the files are parsed once per session, not once per test case)."""
    return copy.deepcopy(_parsed_docs(directory))


@functools.cache
def _parsed_docs(directory: Path) -> list[dict[str, Any]]:
    """kustomize's build, as far as deploy/ uses it: resources (files or kustomization folders),
    components (their resources, then their JSON 6902 patches on the whole result) and
    configMapGenerator (names without the content hash)."""
    kustomization = load((directory / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization.get("resources", []):
        path = (directory / name).resolve()
        docs += copy.deepcopy(_parsed_docs(path)) if path.is_dir() else load_all(path.read_text())
    for name in kustomization.get("components", []):
        component = (directory / name).resolve()
        docs += copy.deepcopy(_parsed_docs(component))
        for patch in load((component / "kustomization.yaml").read_text()).get("patches", []):
            target = patch["target"]
            for doc in docs:
                if doc["kind"] == target["kind"] and doc["metadata"]["name"] == target["name"]:
                    json_patch(doc, load(patch["patch"]))
    for generator in kustomization.get("configMapGenerator", []):
        data = {Path(f).name: (directory / f).read_text() for f in generator["files"]}
        metadata = {"name": generator["name"]}
        if "namespace" in generator:
            metadata["namespace"] = generator["namespace"]
        if labels := generator.get("options", {}).get("labels"):
            metadata["labels"] = labels
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    return docs


def json_patch(doc: dict[str, Any], operations: list[dict[str, Any]]) -> None:
    """RFC 6902 add / replace / remove / test, the operations deploy/'s patches use (kustomize
    applies them with the same meaning)."""
    for op in operations:
        if op["op"] == "test":
            *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
            node: Any = doc
            for key in [*parents, last]:
                node = node[int(key)] if isinstance(node, list) else node[key]
            assert node == op["value"], op
            continue
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if op["op"] == "remove":
                del node[index]
            elif op["op"] == "add":
                node.insert(index, op["value"])
            else:
                node[index] = op["value"]
        elif op["op"] == "remove":
            del node[last]
        else:
            if op["op"] == "replace" and last not in node:
                raise KeyError(f"replace of a missing path {op['path']}")
            node[last] = op["value"]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def raycluster() -> dict[str, Any]:
    (cluster,) = of_kind(load_docs(K8S), "RayCluster")
    return cluster


def kuberay_pods(cluster: dict[str, Any]) -> list[tuple[str, Pod]]:
    """The head and worker pods the KubeRay operator (v1.7.0,
    ray-operator/controllers/ray/common/pod.go) creates from a RayCluster, as far as Pod Security
    reads them: each group's template plus what the operator adds. Head (DefaultHeadPodTemplate,
    BuildPod): with in-tree autoscaling, the `autoscaler` container (BuildAutoscalerContainer; its
    securityContext is autoscalerOptions.securityContext, mergeAutoscalerOverrides) and the
    `ray-logs` emptyDir both mount. Workers (DefaultWorkerPodTemplate): the `wait-gcs-ready` init
    container, appended after the template's own, with a deep copy of the Ray container's
    securityContext. Every Ray container: the `shared-mem` emptyDir at /dev/shm, and liveness and
    readiness probes as httpGet on the dashboard agent's port without a host (Ray >= 2.53)."""
    spec = cluster["spec"]

    def ray_pod(template: dict[str, Any]) -> Pod:
        pod = copy.deepcopy(template["spec"])
        ray = pod["containers"][0]
        probe = {"httpGet": {"path": "/api/healthz", "port": 52365}}
        ray.setdefault("livenessProbe", probe)
        ray.setdefault("readinessProbe", probe)
        volumes = pod.setdefault("volumes", [])
        if not any(m["mountPath"] == "/dev/shm" for m in ray.get("volumeMounts", [])):
            volumes.append({"name": "shared-mem", "emptyDir": {"medium": "Memory"}})
            ray.setdefault("volumeMounts", []).append({"name": "shared-mem", "mountPath": "/dev/shm"})
        return pod

    auth = spec.get("authOptions") or {}
    token_auth = auth.get("mode", "token") == "token" if auth else False

    def with_token(container: dict[str, Any]) -> None:
        """SetContainerTokenAuthEnvVars: RAY_AUTH_MODE=token, RAY_AUTH_TOKEN from the Secret
        (secretName, else one named after the cluster), key auth_token; unless already set."""
        env = container.setdefault("env", [])
        names = {e["name"] for e in env}
        if "RAY_AUTH_MODE" not in names:
            env.append({"name": "RAY_AUTH_MODE", "value": "token"})
        if "RAY_AUTH_TOKEN" not in names:
            secret = auth.get("secretName") or cluster["metadata"]["name"]
            ref = {"secretKeyRef": {"name": secret, "key": "auth_token"}}
            env.append({"name": "RAY_AUTH_TOKEN", "valueFrom": ref})

    head = ray_pod(spec["headGroupSpec"]["template"])
    if spec.get("enableInTreeAutoscaling"):
        # BuildHeadPodTemplate: the head runs as the autoscaler's service account.
        head["serviceAccountName"] = cluster["metadata"]["name"]
        options = spec.get("autoscalerOptions", {})
        autoscaler = {
            "name": "autoscaler",
            "image": head["containers"][0]["image"],
            "volumeMounts": [{"name": "ray-logs", "mountPath": "/tmp/ray"}],
        }
        if token_auth:
            with_token(autoscaler)
        # mergeAutoscalerOverrides
        autoscaler["volumeMounts"] += copy.deepcopy(options.get("volumeMounts", []))
        autoscaler.setdefault("env", []).extend(copy.deepcopy(options.get("env", [])))
        if "securityContext" in options:
            autoscaler["securityContext"] = copy.deepcopy(options["securityContext"])
        head["containers"].append(autoscaler)
        head["volumes"].append({"name": "ray-logs", "emptyDir": {}})
    if token_auth:
        with_token(head["containers"][0])
    pods = [("RayCluster/head", head)]
    for group in spec["workerGroupSpecs"]:
        worker = ray_pod(group["template"])
        ray = worker["containers"][0]
        wait = {"name": "wait-gcs-ready", "image": ray["image"]}
        if "securityContext" in ray:
            wait["securityContext"] = copy.deepcopy(ray["securityContext"])
        worker["initContainers"] = [*worker.get("initContainers", []), wait]
        if token_auth:
            with_token(ray)
            with_token(wait)
        pods.append((f"RayCluster/{group['groupName']}", worker))
    return pods


def workload_pods(docs: list[dict[str, Any]]) -> list[tuple[str, Pod]]:
    """(owner, pod spec) of every Deployment, DaemonSet, Job and RayCluster group (with the
    containers the KubeRay operator adds)."""
    pods = [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet", "Job")
    ]
    for cluster in of_kind(docs, "RayCluster"):
        pods += kuberay_pods(cluster)
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


# The chart's RBAC (dagster-io/dagster, helm/dagster, read at the commits named; the source index
# here holds default-branch versions and cannot select the 1.13.27 tag, and the switches used
# below read the same in every version read): with `rbacEnabled` (default true) the parent chart
# binds its service account to templates/role.yaml's Role (commit 539a50b0), and the
# dagster-user-deployments subchart, with its own `rbacEnabled` (default true), binds the code
# server's account to its templates/role.yaml's (commit 1885ee04).
CHART_ROLE_RULES = [
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    },
    {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["get", "watch", "list"]},
    {
        "apiGroups": [""],
        "resources": ["pods", "events"],
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    },
    {"apiGroups": [""], "resources": ["pods/log", "pods/status"], "verbs": ["get", "watch", "list"]},
]
USER_DEPLOYMENTS_ROLE_RULES = [
    {"apiGroups": ["batch"], "resources": ["jobs", "jobs/status", "cronjobs"], "verbs": ["*"]},
    {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/status"], "verbs": ["*"]},
]


def chart_service_account(values: dict[str, Any]) -> str:
    """The webserver's and daemon's account (templates/helpers/_helpers.tpl
    `dagster.serviceAccountName`): global.serviceAccountName, else serviceAccount.name, else the
    chart's full name (`dagster` for release `dagster`)."""
    return (
        values.get("global", {}).get("serviceAccountName")
        or values.get("serviceAccount", {}).get("name")
        or "dagster"
    )


def user_deployments_service_account(values: dict[str, Any]) -> str:
    """The code server's account (the subchart's templates/helpers/_helpers.tpl
    `dagsterUserDeployments.serviceAccountName`): global.serviceAccountName, else the subchart's
    serviceAccount.name, else `<full name>-user-deployments` (the subchart's full name is
    `dagster-dagster-user-deployments` for release `dagster`)."""
    user = values.get("dagster-user-deployments", {})
    return (
        values.get("global", {}).get("serviceAccountName")
        or user.get("serviceAccount", {}).get("name")
        or "dagster-dagster-user-deployments-user-deployments"
    )


def chart_rbac(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The ServiceAccounts, Roles and RoleBindings the chart renders from `values` (release
    `dagster` in `fleet`): templates/serviceaccount.yaml (serviceAccount.create, default true),
    role.yaml and rolebinding.yaml (rbacEnabled, default true); the subchart's
    serviceaccount.yaml (its serviceAccount.create, default true, and no global.serviceAccountName),
    role.yaml and rolebinding.yaml (its rbacEnabled, default true)."""
    user = values.get("dagster-user-deployments", {})
    global_account = values.get("global", {}).get("serviceAccountName")
    objects: list[dict[str, Any]] = []

    def grant(role: str, rules: list[dict[str, Any]], account: str) -> None:
        meta = {"name": role, "namespace": "fleet"}
        objects.append({"kind": "Role", "metadata": meta, "rules": copy.deepcopy(rules)})
        subject = {"kind": "ServiceAccount", "name": account, "namespace": "fleet"}
        objects.append(
            {
                "kind": "RoleBinding",
                "metadata": {"name": f"{role}binding", "namespace": "fleet"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": [subject],
            }
        )

    if values.get("serviceAccount", {}).get("create", True):
        objects.append({"kind": "ServiceAccount", "metadata": {"name": chart_service_account(values)}})
    if values.get("rbacEnabled", True):
        grant("dagster-role", CHART_ROLE_RULES, chart_service_account(values))
    if user.get("serviceAccount", {}).get("create", True) and not global_account:
        account = user_deployments_service_account(values)
        objects.append({"kind": "ServiceAccount", "metadata": {"name": account}})
    if user.get("rbacEnabled", True):
        grant(
            "dagster-dagster-user-deployments-role",
            USER_DEPLOYMENTS_ROLE_RULES,
            user_deployments_service_account(values),
        )
    return objects


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
                    "serviceAccountName": chart_service_account(values),
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
                    # The subchart's templates/deployment-user.yaml sets the pod's
                    # automountServiceAccountToken to true (commit 042cec96): whatever the
                    # account says, the code server holds its token.
                    "serviceAccountName": user_deployments_service_account(values),
                    "automountServiceAccountToken": True,
                    "securityContext": d.get("podSecurityContext", {}),
                    "containers": [
                        {
                            "name": "dagster",
                            "securityContext": d.get("securityContext"),
                            "ports": [{"containerPort": d["port"]}],
                            "volumeMounts": d.get("volumeMounts", []),
                        }
                    ],
                    "volumes": d.get("volumes", []),
                },
            )
        )
    pods.append(("chart/run", chart_run_job(values)["spec"]["template"]["spec"]))
    return pods


def snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def launched_run_job(
    launcher_config: dict[str, Any], container_context: dict[str, Any] | None
) -> dict[str, Any]:
    """See build_run_job; memoized (a launch takes a temporary instance), each caller gets a copy."""
    key = json.dumps([launcher_config, container_context], sort_keys=True)
    if key not in _RUN_JOBS:
        _RUN_JOBS[key] = build_run_job(launcher_config, container_context)
    return copy.deepcopy(_RUN_JOBS[key])


_RUN_JOBS: dict[str, dict[str, Any]] = {}


@functools.cache
def launch_instance() -> Any:
    """The temporary Dagster instance every launch of the process records its run in, made once
    (~0.5 s each: its SQLite storages migrate) and never entered, so it leaves no defs-state
    storage in Dagster's context; removed when the process ends."""
    import atexit
    import shutil
    import tempfile

    import dagster as dg

    home = tempfile.mkdtemp(prefix="fleet-run-jobs-")
    atexit.register(shutil.rmtree, home, True)
    instance = dg.DagsterInstance.local_temp(home)
    atexit.register(instance.dispose)  # runs before the folder's removal (last in, first out)
    return instance


def build_run_job(
    launcher_config: dict[str, Any], container_context: dict[str, Any] | None
) -> dict[str, Any]:
    """The Job a K8sRunLauncher configured with `launcher_config` submits for a run whose code
    location reports `container_context`, built by dagster-k8s itself: a real K8sRunLauncher, a real
    run in a real (temporary) instance, `launch_run` (its merge of the launcher's settings with the
    code location's container context and the run's tags, then construct_dagster_k8s_job). Only
    the last call goes to a fake: there is no API server here, so the Job is captured instead of
    created. Returned as Kubernetes JSON."""
    import tempfile

    import kubernetes
    from dagster._config import process_config
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.launcher import LaunchRunContext
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster._core.test_utils import create_run_for_test
    from dagster_k8s import K8sRunLauncher

    with tempfile.TemporaryDirectory() as home:
        kubeconfig = Path(home) / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG)
        config = {**launcher_config, "load_incluster_config": False, "kubeconfig_file": str(kubeconfig)}
        processed = process_config(K8sRunLauncher.config_type(), config)
        assert processed.success, processed.errors
        launcher = K8sRunLauncher(**processed.value)
        instance = launch_instance()
        launcher.register_instance(instance)
        submitted: list[tuple[str, Any]] = []

        def fake_create_job(body: Any, namespace: str) -> None:  # no API server: capture
            submitted.append((namespace, body))

        launcher._api_client.create_namespaced_job_with_retries = fake_create_job  # type: ignore[method-assign]
        origin = JobPythonOrigin(
            "deliberation",
            RepositoryPythonOrigin(
                executable_path="/opt/venv/bin/python",
                code_pointer=ModuleCodePointer("fleet_pipelines.definitions", "defs", None),
                container_image=f"registry.example.com/fleet-pipelines:{IMAGE_TAG}",
                container_context=container_context,
            ),
        )
        run = create_run_for_test(instance, job_name="deliberation", job_code_origin=origin)
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    ((namespace, job),) = submitted
    job = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    job["metadata"]["namespace"] = namespace
    return job


def instance_run_job() -> dict[str, Any]:
    """The run Job of deploy/dagster/dagster.yaml's K8sRunLauncher (the code server sets no
    container context on this route)."""
    return launched_run_job(INSTANCE["run_launcher"]["config"], None)


def chart_run_launcher(values: dict[str, Any]) -> dict[str, Any]:
    """The K8sRunLauncher config the chart renders from our values (release `dagster`):
    templates/helpers/instance/_run-launcher.tpl, keys of runK8sConfig snake_cased one level
    down."""
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    config = {
        "load_incluster_config": True,
        "job_namespace": launcher["jobNamespace"],
        "image_pull_policy": launcher["imagePullPolicy"],
        "service_account_name": chart_service_account(values),
        "dagster_home": values["global"]["dagsterHome"],
        "instance_config_map": "dagster-instance",
        "postgres_password_secret": values["global"]["postgresqlSecretName"],
        "env_config_maps": [r["name"] for r in launcher.get("envConfigMaps", [])],
        "env_secrets": [r["name"] for r in launcher.get("envSecrets", [])],
    }
    for key in ("volumeMounts", "volumes", "labels", "resources", "securityContext"):
        if key in launcher:
            config[snake(key)] = launcher[key]
    if "runK8sConfig" in launcher:
        config["run_k8s_config"] = {snake(k): v for k, v in launcher["runK8sConfig"].items()}
    return config


def chart_container_context(values: dict[str, Any]) -> dict[str, Any] | None:
    """What the chart's user deployment reports as its code location's container context
    (DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT, dagster-user-deployments helper
    `dagsterUserDeployments.k8sContainerContext`), or None with includeConfigInLaunchedRuns off."""
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    if not deployment.get("includeConfigInLaunchedRuns", {"enabled": True})["enabled"]:
        return None
    k8s: dict[str, Any] = {
        "image_pull_policy": deployment["image"]["pullPolicy"],
        "env_config_maps": [
            f"dagster-dagster-user-deployments-{deployment['name']}-user-env",
            *[r["name"] for r in deployment.get("envConfigMaps", [])],
        ],
        "namespace": "fleet",
        "service_account_name": user_deployments_service_account(values),
    }
    if deployment.get("envSecrets"):
        k8s["env_secrets"] = [r["name"] for r in deployment["envSecrets"]]
    for key in ("volumeMounts", "volumes", "labels", "resources"):
        if deployment.get(key):
            k8s[snake(key)] = deployment[key]
    return {"k8s": k8s}


def chart_run_job(values: dict[str, Any]) -> dict[str, Any]:
    """The run Job of the chart's K8sRunLauncher, for a run of our user deployment."""
    return launched_run_job(chart_run_launcher(values), chart_container_context(values))


# Every image the NATS chart 2.14.2 can deploy, by the values path that names it, with the chart's
# default (nats-io/k8s at tag nats-2.14.2, helm/charts/nats/values.yaml; each rendered through
# the `nats.image` helper by files/stateful-set/{nats,reloader,prom-exporter}-container.yaml and
# files/nats-box/deployment/container.yaml, which the chart's request-reply test pod reuses).
NATS_CHART_IMAGES: dict[tuple[str, ...], dict[str, str]] = {
    ("container", "image"): {"repository": "nats", "tag": "2.14.2-alpine"},
    ("reloader", "image"): {"repository": "natsio/nats-server-config-reloader", "tag": "0.23.0"},
    ("promExporter", "image"): {"repository": "natsio/prometheus-nats-exporter", "tag": "0.20.1"},
    ("natsBox", "container", "image"): {"repository": "natsio/nats-box", "tag": "0.19.7"},
}


def nats_image(values: dict[str, Any], path: tuple[str, ...]) -> str:
    """The image the NATS chart renders at `path`: our values over the chart's default, through
    its `nats.image` helper (templates/_helpers.tpl, 2.14.2): repository@digest when a digest is
    set, else repository:tag; the image's registry, else global.image.registry, in front;
    fullImageName over everything."""
    image = dict(NATS_CHART_IMAGES[path])
    node: Any = values
    for key in path:
        node = node.get(key, {})
    image.update({k: v for k, v in node.items() if v})
    name = (
        f"{image['repository']}@{image['digest']}"
        if image.get("digest")
        else f"{image['repository']}:{image['tag']}"
    )
    registry = image.get("registry") or values.get("global", {}).get("image", {}).get("registry")
    if registry:
        name = f"{registry}/{name}"
    return image.get("fullImageName") or name


def nats_pods(values: dict[str, Any]) -> list[tuple[str, Pod]]:
    """The NATS StatefulSet pod (chart 2.14.2, files/stateful-set/pod-template.yaml): the nats
    container, the config reloader when enabled, merged with our `merge` values; and nats-box
    when enabled."""
    spec = copy.deepcopy(values.get("podTemplate", {}).get("merge", {}).get("spec", {}))
    nats = {"name": "nats", "image": nats_image(values, ("container", "image"))}
    spec["containers"] = [{**nats, **values.get("container", {}).get("merge", {})}]
    if values.get("reloader", {}).get("enabled", True):
        reloader = {"name": "reloader", "image": nats_image(values, ("reloader", "image"))}
        spec["containers"].append({**reloader, **values.get("reloader", {}).get("merge", {})})
    pods = [("chart/nats", spec)]
    box = values.get("natsBox", {})
    if box.get("enabled", True):
        box_spec = copy.deepcopy(box.get("podTemplate", {}).get("merge", {}).get("spec", {}))
        container = {"name": "nats-box", "image": nats_image(values, ("natsBox", "container", "image"))}
        box_spec["containers"] = [{**container, **box.get("container", {}).get("merge", {})}]
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
