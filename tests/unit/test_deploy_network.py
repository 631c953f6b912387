"""The network is closed by default: exactly the flows of deploy/README.md's table ("Network")
connect, on every Ray, Dagster, NATS, engine and PostgreSQL port, and a pod outside them connects
to nothing.

No network plugin runs here. tests/unit/netpol.py decides what the policies let through, and is
first checked against upstream's own NetworkPolicy truth tables (kubernetes'
test/e2e/network/netpol/network_policy.go, carried in tests/unit/schemas/netpol-upstream-cases.yaml
with its source and commit). Then every pod deploy/ runs (both Dagster routes, the KubeRay pods
with the labels the operator sets, the run pods dagster-k8s builds, the NATS chart's servers) plus
the peers around them (cluster DNS, a PostgreSQL, a pod of another namespace, an unlabelled pod in
namespace fleet, addresses outside the cluster) is probed pair by pair."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .deploy_objects import (
    DAGSTER_DIR,
    K8S,
    NODE_DIR,
    README,
    VALUES,
    chart_run_job,
    instance_run_job,
    load_docs,
    of_kind,
)
from .netpol import Cluster, Endpoint

# --- upstream's truth tables ------------------------------------------------------------------------

CASES = yaml.safe_load((Path(__file__).parent / "schemas" / "netpol-upstream-cases.yaml").read_text())


def upstream_model(case: dict[str, Any]) -> tuple[Cluster, list[Endpoint]]:
    ports = case.get("ports", [80])
    protocols = case.get("protocols", ["TCP"])
    pods = [
        Endpoint(
            name=p,
            ip=f"10.0.{i // 250}.{i % 250 + 1}",
            namespace=p.split("/")[0],
            labels={"pod": p.split("/")[1]},
            ports=tuple(
                (f"serve-{port}-{proto.lower()}", proto, port) for port in ports for proto in protocols
            ),
        )
        for i, p in enumerate(case["pods"])
    ]
    ips = {p.name: p.ip for p in pods}
    policies = []
    for i, policy in enumerate(case["policies"]):
        text = yaml.safe_dump(policy["spec"])
        for name, ip in ips.items():
            text = text.replace("{" + name + "}", ip)
        policies.append(
            {"metadata": {"name": f"p{i}", "namespace": policy["namespace"]}, "spec": yaml.safe_load(text)}
        )
    namespaces = {ns: {"ns": ns} for ns in ("x", "y", "z")}
    return Cluster(namespaces, policies), pods


def peer_matches(peer: dict[str, str], pod: Endpoint) -> bool:
    namespace, name = pod.name.split("/")
    return peer.get("namespace", namespace) == namespace and peer.get("pod", name) == name


def expected_table(pods: list[Endpoint], expectations: list[list[Any]]) -> dict[tuple[str, str], bool]:
    """reachability.go: all true, then each Expect* call in order."""
    table = {(a.name, b.name): True for a in pods for b in pods}
    for kind, *args in expectations:
        for a, b in table:
            source, destination = next(p for p in pods if p.name == a), next(p for p in pods if p.name == b)
            if kind == "peer" and peer_matches(args[0], source) and peer_matches(args[1], destination):
                table[a, b] = args[2]
            elif (kind == "ingress" and b == args[0]) or (kind == "egress" and a == args[0]):
                table[a, b] = args[1]
            elif kind == "pair" and (a, b) == (args[0], args[1]):
                table[a, b] = args[2]
    return {pair: v for pair, v in table.items() if pair[0] != pair[1]}  # ignoreLoopback


def probes() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(f"{c['name']} [{p['protocol']} {p['port']}]", c, p) for c in CASES for p in c["probes"]]


@pytest.mark.parametrize(("name", "case", "probe"), probes(), ids=[n for n, _, _ in probes()])
def test_the_evaluator_agrees_with_upstreams_truth_table(
    name: str, case: dict[str, Any], probe: dict[str, Any]
):
    cluster, pods = upstream_model(case)
    expected = expected_table(pods, probe["expect"])
    found = {
        (a.name, b.name): cluster.connects(a, b, probe["protocol"], probe["port"])
        for a, b in itertools.permutations(pods, 2)
    }
    assert found == expected, {k: v for k, v in found.items() if expected[k] != v}


def test_the_upstream_cases_exercise_each_part_of_the_semantics():
    """Selectors (labels, expressions, namespaces, both ANDed, ORed peers), numbered and named
    ports, protocols, egress, ipBlock, stacked policies; and the evaluator does not pass them by
    allowing everything or nothing."""
    text = yaml.safe_dump(CASES)
    for part in (
        "matchExpressions",
        "NotIn",
        "namespaceSelector",
        "serve-81-tcp",
        "UDP",
        "ipBlock",
        "egress",
    ):
        assert part in text, part
    outcomes = set()
    for _, case, probe in probes():
        outcomes |= set(expected_table(upstream_model(case)[1], probe["expect"]).values())
    assert outcomes == {True, False}
    assert len(probes()) >= 30


# --- our deployment ----------------------------------------------------------------------------------

TCP_PORTS = {
    "DNS": [53],
    "HTTPS / Kubernetes API": [443, 6443],
    "Dagster": [3000, 3030, 80],
    "NATS": [4222, 6222, 8222, 7422, 7522],
    "PostgreSQL": [5432],
    "Ray": [6379, 8265, 10001, 10002, 19999, 52365, 8080, 44217, 44227, 8076, 8077],
    "engine": [8000],
}
PROBES = [("TCP", p) for ports in TCP_PORTS.values() for p in ports] + [("UDP", 53)]


def ray_pods() -> list[tuple[str, dict[str, str]]]:
    """The KubeRay pods with the labels the operator sets (v1.7.0 utils/constant.go: ray.io/cluster,
    ray.io/node-type, ray.io/group) over the template's."""
    (cluster,) = of_kind(load_docs(K8S), "RayCluster")
    name = cluster["metadata"]["name"]
    spec = cluster["spec"]
    head = spec["headGroupSpec"]["template"].get("metadata", {}).get("labels", {})
    found = [
        (
            "Ray head",
            {**head, "ray.io/cluster": name, "ray.io/node-type": "head", "ray.io/group": "headgroup"},
        )
    ]
    for group in spec["workerGroupSpecs"]:
        labels = group["template"].get("metadata", {}).get("labels", {})
        found.append(
            (
                "Ray worker",
                {
                    **labels,
                    "ray.io/cluster": name,
                    "ray.io/node-type": "worker",
                    "ray.io/group": group["groupName"],
                },
            )
        )
    return found


def template_labels(directory: Path, kind: str, name: str) -> dict[str, str]:
    (doc,) = [d for d in of_kind(load_docs(directory), kind) if d["metadata"]["name"] == name]
    return doc["spec"]["template"]["metadata"]["labels"]


# The Dagster chart's pod labels (helm/dagster templates: helpers/_deployment-webserver.tpl,
# deployment-daemon.yaml, charts/dagster-user-deployments/templates/deployment-user.yaml; release
# `dagster`) and the NATS chart's (2.x: the StatefulSet's selector labels, release fleet-nats).
CHART = {"app.kubernetes.io/name": "dagster", "app.kubernetes.io/instance": "dagster"}
NATS_LABELS = {
    "app.kubernetes.io/name": "nats",
    "app.kubernetes.io/instance": "fleet-nats",
    "app.kubernetes.io/component": "nats",
}


def universe() -> list[tuple[str, Endpoint]]:
    """(component as deploy/README.md's table names it, endpoint)."""
    pods: list[tuple[str, str, dict[str, str]]] = [(c, "fleet", labels) for c, labels in ray_pods()]
    pods += [
        ("engine", "fleet", template_labels(K8S, "Deployment", "fleet-vllm")),
        ("engine", "fleet", template_labels(K8S / "engine" / "cpu", "Deployment", "fleet-llamacpp")),
        ("nats-init", "fleet", template_labels(K8S, "Job", "fleet-nats-init")),
        ("webserver", "fleet", template_labels(DAGSTER_DIR, "Deployment", "dagster-webserver")),
        ("daemon", "fleet", template_labels(DAGSTER_DIR, "Deployment", "dagster-daemon")),
        ("code server", "fleet", template_labels(DAGSTER_DIR, "Deployment", "fleet-pipelines")),
        ("webserver", "fleet", {**CHART, "component": "dagster-webserver"}),
        ("daemon", "fleet", {**CHART, "component": "dagster-daemon", "deployment": "daemon"}),
        ("code server", "fleet", {**CHART, "component": "user-deployments", "deployment": "fleet-pipelines"}),
        ("run pod", "fleet", instance_run_job()["spec"]["template"]["metadata"]["labels"]),
        ("run pod", "fleet", chart_run_job(VALUES)["spec"]["template"]["metadata"]["labels"]),
        ("NATS", "fleet", NATS_LABELS),
        ("PostgreSQL", "fleet", {"fleet-pipelines.io/component": "postgresql"}),
        ("cluster DNS", "kube-system", {"k8s-app": "kube-dns"}),
        ("other pod in fleet", "fleet", {"app": "debug"}),
        ("pod in another namespace", "default", {"app": "anything"}),
        ("KubeRay operator", "kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"}),
        (
            "node installer",
            "fleet-node",
            template_labels(NODE_DIR, "DaemonSet", "fleet-sandbox-profiles"),
        ),
    ]
    found = [
        (component, Endpoint(f"{component} #{i}", f"10.244.{i // 250}.{i % 250 + 1}", ns, labels))
        for i, (component, ns, labels) in enumerate(pods)
    ]
    # Outside the cluster: object storage, the Kubernetes API (kind: the control-plane node), a git host.
    found += [
        ("address outside the cluster", Endpoint("object storage", "52.216.8.1")),
        ("address outside the cluster", Endpoint("Kubernetes API", "172.18.0.2")),
        ("address outside the cluster", Endpoint("git host", "140.82.112.3")),
    ]
    return found


def deploy_cluster() -> Cluster:
    policies = of_kind(load_docs(K8S) + load_docs(NODE_DIR), "NetworkPolicy")
    namespaces = {"fleet": {}, "kube-system": {}, "default": {}, "kuberay-system": {}, "fleet-node": {}}
    return Cluster(namespaces, policies)


ANY_ADDRESS = "any address"


def table_rows() -> list[tuple[set[str], set[str], set[tuple[str, int]] | None]]:
    """(from components, to components, (protocol, port) set or None for every port) of the table
    in deploy/README.md's "Network" section."""
    section = README.split("## Network", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or cells[0] in ("from", "") or set(cells[0]) <= {"-"}:
            continue
        sources = {c.strip() for c in cells[0].split(",")}
        destinations = {c.strip() for c in cells[1].split(",")}
        if cells[2] == "every port":
            ports = None
        else:
            ports = {(m[0], int(m[1])) for m in re.findall(r"(TCP|UDP) (\d+)", cells[2])}
        rows.append((sources, destinations, ports))
    return rows


def every_pod_component(component: str) -> bool:
    return component not in ("address outside the cluster",)


def in_table(
    source: str, source_ns: str | None, destination: str, destination_ns: str | None, probe: tuple[str, int]
) -> bool:
    for sources, destinations, ports in table_rows():
        from_ok = source in sources or ("every pod in fleet" in sources and source_ns == "fleet")
        to_ok = destination in destinations or (ANY_ADDRESS in destinations and destination_ns != "fleet")
        if from_ok and to_ok and (ports is None or probe in ports):
            return True
    return False


def flows() -> dict[tuple[str, str, str, str], bool]:
    """(source, destination endpoint names, protocol, port) -> connects, for every pair and probe."""
    cluster = deploy_cluster()
    endpoints = [e for _, e in universe()]
    return {
        (a.name, b.name, proto, port): cluster.connects(a, b, proto, port)
        for a, b in itertools.permutations(endpoints, 2)
        for proto, port in PROBES
    }


FLOWS = flows()
COMPONENT = {e.name: c for c, e in universe()}
NAMESPACE = {e.name: e.namespace for _, e in universe()}


def test_the_table_names_only_components_that_exist():
    known = set(COMPONENT.values()) | {ANY_ADDRESS, "every pod in fleet"}
    rows = table_rows()
    assert len(rows) >= 10
    for sources, destinations, _ in rows:
        assert sources | destinations <= known, (sources | destinations) - known


def test_nothing_connects_that_the_table_does_not_list():
    extra = sorted(
        (COMPONENT[a], COMPONENT[b], proto, port)
        for (a, b, proto, port), ok in FLOWS.items()
        if ok
        and not in_table(COMPONENT[a], NAMESPACE[a], COMPONENT[b], NAMESPACE[b], (proto, port))
        and NAMESPACE[a] == "fleet"  # what other namespaces' pods do outward is theirs to police
    )
    extra += sorted(
        (COMPONENT[a], COMPONENT[b], proto, port)
        for (a, b, proto, port), ok in FLOWS.items()
        if ok and NAMESPACE[b] in ("fleet", "fleet-node") and NAMESPACE[a] != "fleet"
    )
    assert extra == [], extra


def test_every_flow_of_the_table_connects():
    missing = []
    endpoints = {e.name: e for _, e in universe()}
    for sources, destinations, ports in table_rows():
        for a, b in itertools.permutations(endpoints, 2):
            source_ok = COMPONENT[a] in sources or (
                "every pod in fleet" in sources and NAMESPACE[a] == "fleet"
            )
            if not source_ok:
                continue
            # "any address": at least every address outside the cluster
            outside = NAMESPACE[b] is None
            if not (outside if ANY_ADDRESS in destinations else COMPONENT[b] in destinations):
                continue
            for probe in sorted(ports) if ports is not None else PROBES:
                if not FLOWS[(a, b, *probe)]:
                    missing.append((a, b, probe))
    assert missing == [], missing


@pytest.mark.parametrize("outsider", ["other pod in fleet", "pod in another namespace", "KubeRay operator"])
def test_a_pod_outside_the_table_connects_to_nothing_of_ours(outsider: str):
    (name,) = [n for n, c in COMPONENT.items() if c == outsider]
    reached = sorted(
        (COMPONENT[b], proto, port)
        for (a, b, proto, port), ok in FLOWS.items()
        if a == name and ok and NAMESPACE[b] in ("fleet", "fleet-node")
    )
    assert reached == []


def test_nothing_reaches_the_webserver_or_the_runs():
    """The webserver (no authentication, launches runs) and the run pods accept no connection at all."""
    for (a, b, proto, port), ok in FLOWS.items():
        if COMPONENT[b] in ("webserver", "run pod"):
            assert not ok, (a, b, proto, port)


def test_ray_accepts_clients_only_on_ray_client_port_and_only_from_dagster():
    """Ray's GCS, dashboard / Jobs API and raylets are reachable only from Ray's own pods; Ray Client
    (10001) from the runs and the code server, which present the token."""
    for (a, b, proto, port), ok in FLOWS.items():
        if (
            ok
            and COMPONENT[b] in ("Ray head", "Ray worker")
            and COMPONENT[a] not in ("Ray head", "Ray worker")
        ):
            assert (COMPONENT[a], COMPONENT[b], proto, port) in {
                ("run pod", "Ray head", "TCP", 10001),
                ("code server", "Ray head", "TCP", 10001),
            }


def test_the_node_installer_has_no_network():
    (name,) = [n for n, c in COMPONENT.items() if c == "node installer"]
    assert not any(ok for (a, b, _, _), ok in FLOWS.items() if name in (a, b))
