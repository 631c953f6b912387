"""The flow table comes from the code: every connection a pod of deploy/ opens, derived from the
rendered manifests and deploy/flows.yaml's `dials` and `fixed`, is a row of its table and
connects under the network policies (with the operator's list filled in as
deploy/egress.example.yaml), per pod, for every engine route: `openai` (vLLM behind the Service
fleet-engine), `vllm_actor` (the engine actor on the Ray gpu workers) and `cpu` (llama.cpp).

A pod's dials: for each container, the processes it runs (from its command: the code location,
a Dagster instance, `fleet model pull`, `fleet nats init`, a Ray worker node) and the settings in
its environment (its ConfigMaps' values and plain values; a Secret's value is unknown here), each
setting a process reads that names a host or port pointing where its value points (its URL's
port, else its scheme's); and what flows.yaml's `fixed` lists for its component. Which component a
pod is comes from the labels flows.yaml's `components` names. Prometheus's dials are its scrapes:
each ServiceMonitor and PodMonitor of deploy/monitoring, to the pods it selects, on the container
port its endpoint names."""

from __future__ import annotations

import copy
import functools
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from fleet_pipelines.settings import SECRET_FILE_VARIABLES, FleetSettings
from tests.prometheus import MONITORING

from .deploy_objects import (
    DAGSTER_DIR,
    FLOW_TABLE,
    K8S,
    VALUES,
    chart_run_job,
    chart_storage,
    documented_secrets,
    instance_run_job,
    kuberay_pods,
    load_docs,
    of_kind,
    parse_ports,
)
from .test_deploy_network import NATS_LABELS, deploy_cluster, in_table, universe

Env = dict[str, str | None]  # None: from a Secret (its value is the operator's)
Dial = tuple[str, str, tuple[str, int]]  # (from component, to component, (protocol, port))

SCHEME_PORTS = {"http": 80, "https": 443, "s3": 443, "nats": 4222, "ray": 10001, "postgresql": 5432}
NAMING = ("_URL", "_ADDRESS", "_REMOTE", "_SOURCE", "_HOST", "_PORT", "_STORAGE_PATH")
CHART = {"app.kubernetes.io/name": "dagster", "app.kubernetes.io/instance": "dagster"}


def component_of(labels: dict[str, str]) -> str | None:
    found = [c for c, wanted in FLOW_TABLE["components"].items() if wanted.items() <= labels.items()]
    assert len(found) <= 1, (labels, found)
    return found[0] if found else None


def processes(container: dict[str, Any], ray_group: str | None) -> set[str]:
    """What a container runs, from its command and arguments."""
    words = [*container.get("command", []), *container.get("args", [])]
    text = " ".join(words)
    if words[:3] == ["fleet", "model", "pull"]:
        return {"fleet model pull"}
    if words[:3] == ["fleet", "nats", "init"]:
        return {"fleet nats init"}
    if words[:3] == ["fleet", "metrics", "serve"]:
        return {"fleet metrics serve", "Dagster instance"}  # NATS, the outbox, the run storage
    if "execute_run" in words:
        return {"code location", "Dagster instance", "run"}
    if "fleet_pipelines.definitions" in text:
        return {"code location", "Dagster instance"}
    if words and words[0] in ("dagster-webserver", "dagster-daemon"):
        return {"Dagster instance"}
    if ray_group not in (None, "headgroup") and container["name"].startswith("ray-"):
        return {"Ray worker node"}  # the turn tasks the code location sends run here
    return set()


def environment(container: dict[str, Any], maps: dict[str, dict[str, str]]) -> Env:
    env: Env = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(maps[source["configMapRef"]["name"]])
        elif "secretRef" in source:
            env.update(dict.fromkeys(SECRET_KEYS[source["secretRef"]["name"]]))
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif "configMapKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["configMapKeyRef"]
            env[entry["name"]] = maps[ref["name"]][ref["key"]]
        else:
            env[entry["name"]] = None
    for name in SECRET_FILE_VARIABLES:  # NAME_FILE: NAME read from a mounted Secret
        if f"{name}_FILE" in env:
            env.setdefault(name, None)
    return env


# The keys of the Secrets the README creates (their values are the operator's).
SECRET_KEYS = documented_secrets()


def route_docs(route: str) -> list[dict[str, Any]]:
    """deploy/k8s as applied for the route: engine/gpu (openai, vllm_actor with the backend set in
    fleet-config) or engine/cpu, with deploy/dagster and deploy/monitoring."""
    docs = cpu_docs() if route == "cpu" else load_docs(K8S)
    if route == "vllm_actor":
        (config,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "fleet-config"]
        config["data"]["FLEET_ENGINE_BACKEND"] = "vllm_actor"
    return docs + load_docs(DAGSTER_DIR) + load_docs(MONITORING)


@functools.cache
def _cpu_docs() -> list[dict[str, Any]]:
    """deploy/k8s with the engine/cpu component in place of engine/gpu (its one-line choice)."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["components"] == ["engine/gpu"]
    kustomization["resources"] = [str(K8S / r) for r in kustomization["resources"]]
    kustomization["components"] = [str(K8S / "engine" / "cpu")]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return load_docs(Path(folder))


def cpu_docs() -> list[dict[str, Any]]:
    return copy.deepcopy(_cpu_docs())


def pods(route: str) -> list[tuple[str, dict[str, str], list[dict[str, Any]], dict[str, dict[str, str]]]]:
    """(owner, labels, containers, ConfigMaps) of every pod of the route: the manifests'
    Deployments and Jobs, the KubeRay pods (with the operator's labels and containers), the run
    pods dagster-k8s builds for both Dagster routes, and the chart's Dagster pods."""
    docs = route_docs(route)
    maps = {d["metadata"]["name"]: d["data"] for d in of_kind(docs, "ConfigMap")}
    found = []
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            template = doc["spec"]["template"]
            spec = template["spec"]
            owner = f"{doc['kind']}/{doc['metadata']['name']}"
            found.append(
                (
                    owner,
                    template["metadata"]["labels"],
                    [*spec.get("initContainers", []), *spec["containers"]],
                    maps,
                )
            )
    for cluster in of_kind(docs, "RayCluster"):
        groups = {"RayCluster/head": ("headgroup", cluster["spec"]["headGroupSpec"]["template"])}
        for group in cluster["spec"]["workerGroupSpecs"]:
            groups[f"RayCluster/{group['groupName']}"] = (group["groupName"], group["template"])
        for owner, spec in kuberay_pods(cluster):
            group, template = groups[owner]
            labels = {
                **template.get("metadata", {}).get("labels", {}),
                "ray.io/cluster": cluster["metadata"]["name"],
                "ray.io/node-type": "head" if group == "headgroup" else "worker",
                "ray.io/group": group,
            }
            containers = [
                {**c, "_ray_group": group} for c in [*spec.get("initContainers", []), *spec["containers"]]
            ]
            found.append((owner, labels, containers, maps))
    for owner, job in (("run pod (plain)", instance_run_job()), ("run pod (chart)", chart_run_job(VALUES))):
        template = job["spec"]["template"]
        found.append((owner, template["metadata"]["labels"], template["spec"]["containers"], maps))
    # The chart's pods (1.13.27): webserver and daemon run the instance; the user deployment runs
    # `dagster api grpc` with our module, its env from envConfigMaps, envSecrets and env.
    (user,) = VALUES["dagster-user-deployments"]["deployments"]
    code_server = {
        "name": "dagster",
        "args": ["dagster", "api", "grpc", *user["dagsterApiGrpcArgs"]],
        "envFrom": [
            *({"configMapRef": {"name": r["name"]}} for r in user.get("envConfigMaps", [])),
            *({"secretRef": {"name": r["name"]}} for r in user.get("envSecrets", [])),
        ],
        "env": user.get("env", []),
    }
    found.append(("chart/user-deployment", {**CHART, "component": "user-deployments"}, [code_server], maps))
    for owner, key, command in (
        ("chart/webserver", "dagsterWebserver", "dagster-webserver"),
        ("chart/daemon", "dagsterDaemon", "dagster-daemon"),
    ):
        container = {"name": "dagster", "command": [command], "env": VALUES[key].get("env", [])}
        found.append((owner, {**CHART, "component": command}, [container], maps))
    # The NATS chart's servers (2.14.2): they dial only the cluster routes (`fixed`).
    found.append(("chart/nats", NATS_LABELS, [], maps))
    return found


def destination(setting: str, value: str | None) -> tuple[str, tuple[str, int]] | None:
    """Where a setting's value points: (component, (protocol, port)); None for a local path."""
    dial = FLOW_TABLE["dials"][setting]
    if value is not None and "port" not in dial:
        parts = urlsplit(value)
        if parts.scheme not in SCHEME_PORTS:
            return None  # a local path (kind's shared volume): nothing dialed
        return dial["to"], ("TCP", parts.port or SCHEME_PORTS[parts.scheme])
    (port,) = parse_ports([dial["port"]])
    return dial["to"], port


def dials(route: str) -> dict[str, set[Dial]]:
    """Owner -> what its pod dials on the route."""
    found: dict[str, set[Dial]] = {}
    instance_pg = chart_storage(VALUES)["run_storage"]["config"]["postgres_db"]
    for owner, labels, containers, maps in pods(route):
        component = component_of(labels)
        assert component is not None, (owner, labels)
        mine: set[Dial] = set()
        for container in containers:
            env = environment(container, maps)
            running = processes(container, container.get("_ray_group"))
            if "Dagster instance" in running and "DAGSTER_PG_HOST" not in env:
                env["DAGSTER_PG_HOST"] = instance_pg["hostname"]  # the chart renders it inline
                assert instance_pg["port"] == 5432
            for setting, dial in FLOW_TABLE["dials"].items():
                if not running & set(dial["read_by"]) or setting not in env:
                    continue
                if "backend" in dial and env.get("FLEET_ENGINE_BACKEND") != dial["backend"]:
                    continue
                where = destination(setting, env[setting])
                if where is not None:
                    mine.add((component, where[0], where[1]))
        for fixed in FLOW_TABLE["fixed"]:
            if component in fixed["from"] or "every pod in fleet" in fixed["from"]:
                mine |= {(component, fixed["to"], port) for port in parse_ports(fixed["ports"]) or ()}
        found[owner] = mine
    found["Prometheus (monitors)"] = scrapes(route)
    return found


# KubeRay (v1.7.0 utils/constant.go: MetricsPortName, DefaultMetricsPort) gives each Ray container
# this port when its template names none.
KUBERAY_METRICS_PORT = ("metrics", 8080)


def scrapes(route: str) -> set[Dial]:
    """Prometheus's dials: each ServiceMonitor's and PodMonitor's endpoints, to the pods it selects
    (a ServiceMonitor's: the pods behind the Services it selects), on the container port the
    endpoint names (through the Service's targetPort)."""
    docs = route_docs(route)
    found: set[Dial] = set()
    for monitor in [*of_kind(docs, "ServiceMonitor"), *of_kind(docs, "PodMonitor")]:
        selector = monitor["spec"]["selector"]["matchLabels"]
        if monitor["kind"] == "ServiceMonitor":
            targets = [
                (s["spec"]["selector"], {p["name"]: p["targetPort"] for p in s["spec"]["ports"]})
                for s in of_kind(docs, "Service")
                if selector.items() <= s["metadata"].get("labels", {}).items()
            ]
            endpoints = [e["port"] for e in monitor["spec"]["endpoints"]]
        else:
            targets = [(selector, {})]
            endpoints = [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]]
        scraped = []
        for pod_selector, service_ports in targets:
            for owner, labels, containers, _ in pods(route):
                if not pod_selector.items() <= labels.items():
                    continue
                named = {p["name"]: p["containerPort"] for c in containers for p in c.get("ports", [])}
                if any("_ray_group" in c for c in containers):
                    named.setdefault(*KUBERAY_METRICS_PORT)
                for endpoint in endpoints:
                    port = service_ports.get(endpoint, endpoint)
                    assert port in named, (monitor["metadata"]["name"], owner, port)
                    found.add(("Prometheus", component_of(labels), ("TCP", named[port])))
                scraped.append(owner)
        assert scraped, (route, monitor["metadata"]["name"])  # every monitor scrapes some pod
    return found


ROUTES = ["openai", "vllm_actor", "cpu"]
CLUSTER = deploy_cluster()  # with deploy/egress.example.yaml's addresses
ENDPOINTS: dict[str, list[Any]] = {}
for _name, _endpoint in universe():
    ENDPOINTS.setdefault(_name, []).append(_endpoint)


@pytest.mark.parametrize("route", ROUTES)
def test_every_dial_is_in_the_table_and_connects(route: str):
    missing, blocked = [], []
    for owner, owned in dials(route).items():
        for source, target, probe in sorted(owned):
            source_ns = ENDPOINTS[source][0].namespace
            if not in_table(
                source, source_ns, target, None if target in FLOW_TABLE["outside"] else "fleet", probe
            ):
                missing.append((owner, target, probe))
            pairs = [
                (a, b) for a in ENDPOINTS[source] for b in ENDPOINTS[target] if a != b
            ]  # a pod to itself (loopback) is never policed
            if not all(CLUSTER.connects(a, b, *probe) for a, b in pairs):
                blocked.append((owner, target, probe))
    assert missing == [], missing
    assert blocked == [], blocked


def test_the_routes_differ_where_the_engine_does():
    """openai and cpu: turns call the engine's Service; vllm_actor: the Ray gpu workers pull the
    model (its model-pull init container) and no turn calls the Service."""
    engine = ("TCP", 8000)
    by_route = {route: set().union(*dials(route).values()) for route in ROUTES}
    for route in ("openai", "cpu"):
        assert ("run pod", "engine", engine) in by_route[route]
        assert ("Ray worker", "engine", engine) in by_route[route]
    assert not any(
        target == "engine" and source != "Prometheus" for source, target, _ in by_route["vllm_actor"]
    )
    assert ("Ray gpu worker", "model source", ("TCP", 443)) in by_route["vllm_actor"]
    assert ("engine", "model source", ("TCP", 443)) in by_route["cpu"]


@pytest.mark.parametrize("route", ROUTES)
def test_prometheus_scrapes_the_exporter_ray_and_the_engine_and_the_exporter_is_a_pod(route: str):
    """The monitors of deploy/monitoring reach the exporter (9464), every Ray pod's metrics port
    (8080) and the engine's /metrics (8000); the exporter's own dials come from its manifest."""
    assert scrapes(route) == {
        ("Prometheus", "metrics exporter", ("TCP", 9464)),
        *(("Prometheus", ray, ("TCP", 8080)) for ray in ("Ray head", "Ray worker", "Ray gpu worker")),
        ("Prometheus", "engine", ("TCP", 8000)),
    }
    assert dials(route)["Deployment/fleet-metrics"] == {
        ("metrics exporter", "NATS", ("TCP", 4222)),
        ("metrics exporter", "PostgreSQL", ("TCP", 5432)),
        ("metrics exporter", "object store", ("TCP", 443)),
        ("metrics exporter", "cluster DNS", ("UDP", 53)),
        ("metrics exporter", "cluster DNS", ("TCP", 53)),
    }


def test_every_row_of_the_table_is_dialed_on_some_route():
    """No row opens a flow nothing dials."""
    dialed = set().union(*(set().union(*dials(route).values()) for route in ROUTES))
    for row in FLOW_TABLE["flows"]:
        for target in row["to"]:
            sources = {s for s, t, _ in dialed if t == target}
            assert "every pod in fleet" in row["from"] or set(row["from"]) <= sources, (row, sources)


def test_every_setting_that_names_a_host_or_port_is_in_dials():
    """A new setting with a URL, address, host or port fails here until flows.yaml says where it
    points and deploy/ admits the flow."""
    for name, field in FleetSettings.model_fields.items():
        aliases = [a for a in getattr(field.validation_alias, "choices", [name]) if isinstance(a, str)]
        names_a_host = any(a.endswith(NAMING) for a in aliases) or (
            isinstance(field.default, str) and urlsplit(field.default).scheme in SCHEME_PORTS
        )
        if names_a_host:
            assert set(aliases) & set(FLOW_TABLE["dials"]), (name, aliases)
    known = {
        a for f in FleetSettings.model_fields.values() for a in getattr(f.validation_alias, "choices", [])
    }
    assert set(FLOW_TABLE["dials"]) - known == {"DAGSTER_PG_HOST"}  # the instance's (dagster.yaml)
