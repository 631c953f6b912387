"""Every identity of deploy/ may do what its component calls and nothing more.

What the Dagster service account needs is read from the code that uses it, not from the chart's
defaults: the K8sRunLauncher methods the daemon and the webserver call (launch, resume, terminate,
health checks, the debug info of a failed start) are followed through dagster-k8s's own
DagsterKubernetesClient (the installed release, read with `ast`) to the Kubernetes client calls they
make, and each call is turned into the request it sends by reading the kubernetes client's own
source (its `call_api(path, method)`), then into the RBAC (resource, verb) the API server checks.
The Role must grant exactly that set, on both Dagster routes (the chart's own RBAC is off). Pods
that call no Kubernetes API (run pods, the code server, Ray workers, the engines, the node
installer) get no token at all, but the chart's code server, which the chart always gives its
account's token: that account is bound to nothing."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from typing import Any

import dagster_k8s.client
import dagster_k8s.launcher
import kubernetes.client
import pytest

from .deploy_objects import (
    DAGSTER_DIR,
    K8S,
    NODE_DIR,
    README,
    VALUES,
    chart_pods,
    chart_rbac,
    chart_run_job,
    containers,
    instance_run_job,
    load_all,
    load_docs,
    of_kind,
    workload_pods,
)

# What the daemon (launch, resume, run monitoring) and the webserver (terminate) call on the run
# launcher: dagster's RunLauncher interface as K8sRunLauncher implements it.
LAUNCHER_ENTRY_POINTS = (
    "launch_run",
    "resume_run",
    "terminate",
    "check_run_worker_health",
    "get_run_worker_debug_info",
)


def methods(cls: type) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(cls).lstrip())
    (node,) = tree.body
    assert isinstance(node, ast.ClassDef)
    return {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}


def attribute_calls(function: ast.AST, owner: str) -> set[str]:
    """Names X of every `self.<owner>.X(...)` (owner "" : `self.X(...)`) inside `function`."""
    found = set()
    for node in ast.walk(function):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        target = node.func.value
        on_self = owner == "" and isinstance(target, ast.Name) and target.id == "self"
        on_owner = (
            owner != ""
            and isinstance(target, ast.Attribute)
            and target.attr == owner
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        )
        if on_self or on_owner:
            found.add(node.func.attr)
    return found


def kubernetes_calls() -> set[tuple[str, str]]:
    """(api, method) of every Kubernetes client call reachable from the launcher's entry points,
    e.g. ("batch_api", "create_namespaced_job")."""
    launcher = methods(dagster_k8s.launcher.K8sRunLauncher)
    client = methods(dagster_k8s.client.DagsterKubernetesClient)
    todo = set()
    for name in LAUNCHER_ENTRY_POINTS:
        todo |= attribute_calls(launcher[name], "_api_client")
        # the launcher's own helpers the entry points call
        for helper in attribute_calls(launcher[name], "") & set(launcher):
            todo |= attribute_calls(launcher[helper], "_api_client")
    seen: set[str] = set()
    calls: set[tuple[str, str]] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in client:
            continue
        seen.add(name)
        for api in ("batch_api", "core_api"):
            calls |= {(api, m) for m in attribute_calls(client[name], api)}
        todo |= attribute_calls(client[name], "") & set(client)
    return calls


API_CLASSES = {"batch_api": kubernetes.client.BatchV1Api, "core_api": kubernetes.client.CoreV1Api}


@functools.cache
def request_of(api: str, method: str) -> tuple[str, str]:
    """(HTTP method, path) the kubernetes client sends for `method`, from its own source."""
    source = inspect.getsource(getattr(API_CLASSES[api], f"{method}_with_http_info"))
    (path, verb) = re.findall(r"call_api\(\s*'([^']+)', '([A-Z]+)'", source)[0]
    return verb, path


def rbac_of(http_method: str, path: str) -> tuple[str, str, str]:
    """(apiGroup, resource[/subresource], verb) the API server authorizes a namespaced request as
    (k8s.io/apiserver's RequestInfoFactory: a GET of a collection is `list`, of a name `get`)."""
    parts = path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[parts.index("namespaces") + 2 :]
    resource, named, sub = rest[0], len(rest) > 1, rest[2:]
    name = resource + ("/" + sub[0] if sub else "")
    verb = {
        ("GET", True): "get",
        ("GET", False): "list",
        ("POST", False): "create",
        ("PUT", True): "update",
        ("PATCH", True): "patch",
        ("DELETE", True): "delete",
        ("DELETE", False): "deletecollection",
    }[(http_method, named)]
    return group, name, verb


def needed() -> set[tuple[str, str, str]]:
    return {rbac_of(*request_of(api, method)) for api, method in kubernetes_calls()}


def granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_call_graph_reaches_the_calls_dagster_k8s_makes():
    """The reading of dagster-k8s finds what a run's life takes: a Job created, its status read,
    deleted on termination, its pods, their logs and events read when a start fails."""
    assert needed() >= {
        ("batch", "jobs", "create"),
        ("batch", "jobs/status", "get"),
        ("batch", "jobs", "delete"),
        ("", "pods", "list"),
        ("", "pods/log", "get"),
        ("", "events", "list"),
    }
    assert rbac_of("GET", "/api/v1/namespaces/{namespace}/pods/{name}/log") == ("", "pods/log", "get")
    assert rbac_of("DELETE", "/apis/batch/v1/namespaces/{namespace}/jobs") == (
        "batch",
        "jobs",
        "deletecollection",
    )


def test_the_dagster_role_grants_exactly_what_the_run_launcher_calls():
    (role,) = of_kind(load_docs(DAGSTER_DIR), "Role")
    assert granted(role) == needed(), sorted(granted(role) ^ needed())
    (binding,) = of_kind(load_docs(DAGSTER_DIR), "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dagster", "namespace": "fleet"}]


def test_only_the_daemon_and_the_webserver_hold_the_dagster_token():
    pods = dict(workload_pods(load_docs(DAGSTER_DIR)))
    with_token = {owner for owner, pod in pods.items() if pod.get("automountServiceAccountToken", True)}
    assert with_token == {"Deployment/dagster-webserver", "Deployment/dagster-daemon"}
    for owner in with_token:
        assert pods[owner]["serviceAccountName"] == "dagster"
    (workload,) = of_kind(load_docs(K8S), "ServiceAccount")  # both Dagster routes use it
    assert workload["automountServiceAccountToken"] is False
    assert pods["Deployment/fleet-pipelines"]["serviceAccountName"] == workload["metadata"]["name"]


@pytest.mark.parametrize("route", ["instance", "chart"])
def test_run_pods_hold_no_service_account_token(route: str):
    """Run pods execute proposal code (in the sandbox): no token, under an identity with no rules,
    on both Dagster routes (the chart's launcher would otherwise give them the chart's account)."""
    job = instance_run_job() if route == "instance" else chart_run_job(VALUES)
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "fleet-workload"
    assert not any("serviceAccountToken" in str(v) for v in pod.get("volumes", []))
    bound = {s["name"] for b in of_kind(load_docs(DAGSTER_DIR), "RoleBinding") for s in b["subjects"]}
    assert "fleet-workload" not in bound


def chart_route_objects() -> list[dict[str, Any]]:
    """What the chart route applies that holds or grants identities: deploy/k8s (fleet-workload),
    deploy/dagster/rbac.yaml (applied before the chart) and what the chart renders from our
    values."""
    return load_docs(K8S) + load_all((DAGSTER_DIR / "rbac.yaml").read_text()) + chart_rbac(VALUES)


def bound_accounts(objects: list[dict[str, Any]]) -> dict[str, set[tuple[str, str, str]]]:
    """Service account -> every (apiGroup, resource, verb) a RoleBinding or ClusterRoleBinding
    among `objects` grants it through a Role of `objects`."""
    roles = {r["metadata"]["name"]: granted(r) for r in objects if r["kind"] in ("Role", "ClusterRole")}
    found: dict[str, set[tuple[str, str, str]]] = {}
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        for subject in binding["subjects"]:
            found.setdefault(subject["name"], set()).update(roles[binding["roleRef"]["name"]])
    return found


def test_the_chart_renders_no_role_and_no_account_of_its_own():
    """Our values turn the chart's RBAC off: by default it would bind its account to a Role that
    creates and patches pods and jobs, and the code server's to one with `*` on pods, jobs and
    cronjobs (the chart's role.yaml files); with ours it renders none and creates no account."""
    defaults = bound_accounts(chart_rbac({}))
    assert ("batch", "cronjobs", "*") in defaults["dagster-dagster-user-deployments-user-deployments"]
    assert ("", "pods", "create") in defaults["dagster"]
    assert chart_rbac(VALUES) == []


def test_on_the_chart_route_each_token_is_bound_as_without_the_chart():
    """The webserver and daemon run as `dagster`, bound only to deploy/dagster/rbac.yaml's Role
    (exactly what the run launcher calls, tested above); the code server runs as fleet-workload,
    whose token the chart mounts but which no binding of the route names; nothing may create
    CronJobs. The README applies rbac.yaml before the chart."""
    pods = dict(chart_pods(VALUES))
    objects = chart_route_objects()
    bound = bound_accounts(objects)
    (role,) = of_kind(load_docs(DAGSTER_DIR), "Role")
    assert pods["chart/webserver"]["serviceAccountName"] == "dagster"
    assert pods["chart/daemon"]["serviceAccountName"] == "dagster"
    assert bound == {"dagster": granted(role)}
    code_server = pods["chart/user-deployment/fleet-pipelines"]
    assert code_server["automountServiceAccountToken"] is True  # the chart's template sets it
    assert code_server["serviceAccountName"] == "fleet-workload"
    assert "fleet-workload" in {a["metadata"]["name"] for a in of_kind(objects, "ServiceAccount")}
    assert not any(resource == "cronjobs" for grants in bound.values() for _, resource, _ in grants)
    rbac = README.index("kubectl apply -f deploy/dagster/rbac.yaml")
    assert rbac < README.index("helm upgrade --install dagster dagster/dagster")


@pytest.mark.parametrize(
    "owner",
    ["RayCluster/cpu", "RayCluster/gpu", "Deployment/fleet-vllm", "Job/fleet-nats-init"],
)
def test_pods_that_call_no_kubernetes_api_get_no_token(owner: str):
    pods = dict(workload_pods(load_docs(K8S)))
    assert pods[owner]["automountServiceAccountToken"] is False


def test_the_ray_head_token_reaches_only_the_autoscaler():
    """The head's service account is the autoscaler's (KubeRay names it); its token is mounted into
    the autoscaler container alone, at the path the autoscaler reads, never into the Ray container
    that runs clients' code."""
    pods = dict(workload_pods(load_docs(K8S)))
    head = pods["RayCluster/head"]
    assert head["automountServiceAccountToken"] is False
    (volume,) = [v for v in head["volumes"] if "projected" in v]
    sources = volume["projected"]["sources"]
    assert any("serviceAccountToken" in s for s in sources)
    holders = {
        c["name"] for c in containers(head) for m in c.get("volumeMounts", []) if m["name"] == volume["name"]
    }
    assert holders == {"autoscaler"}


def test_the_node_installer_has_no_token_and_no_rules():
    docs = load_docs(NODE_DIR)
    assert not of_kind(docs, "ClusterRole") and not of_kind(docs, "ClusterRoleBinding")
    assert not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding")
    ((_, pod),) = workload_pods(docs)
    assert pod["automountServiceAccountToken"] is False
