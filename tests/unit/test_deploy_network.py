"""The network is closed by default: exactly the flows of deploy/flows.yaml's table (shown in
deploy/README.md, "Network") connect, with the operator's address list filled in as
deploy/egress.example.yaml, on every Ray, Dagster, NATS, engine and PostgreSQL port, and a pod
outside them connects to nothing.

No network plugin runs here. tests/unit/netpol.py decides what the policies let through, and is
first checked against upstream's own NetworkPolicy truth tables (kubernetes'
test/e2e/network/netpol/network_policy.go, carried in tests/unit/schemas/netpol-upstream-cases.yaml
with its source and commit). Then every pod deploy/ runs (both Dagster routes, the KubeRay pods
with the labels the operator sets, the run pods dagster-k8s builds, the NATS chart's servers) plus
the peers around them (cluster DNS, a PostgreSQL, a pod of another namespace, an unlabelled pod in
namespace fleet, the addresses of the operator's list and one outside it) is probed pair by pair.
As shipped, the list admits nothing: no pod reaches any address outside the cluster."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prometheus import MONITORING

from .deploy_objects import (
    DAGSTER_DIR,
    EGRESS_EXAMPLE,
    FLOW_TABLE,
    K8S,
    NODE_DIR,
    README,
    VALUES,
    chart_run_job,
    instance_run_job,
    load_docs,
    of_kind,
    table_rows,
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
    "metrics exporter": [9464],
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
                "Ray gpu worker" if group["groupName"] == "gpu" else "Ray worker",
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


# A Prometheus pod as the Prometheus Operator labels it (v0.80 pkg/prometheus/statefulset.go;
# `prometheus` is the Prometheus object's name), in a namespace labelled as deploy/monitoring's
# network-policy.yaml asks.
PROMETHEUS_LABELS = {
    "app.kubernetes.io/name": "prometheus",
    "app.kubernetes.io/managed-by": "prometheus-operator",
    "app.kubernetes.io/instance": "prometheus",
    "prometheus": "prometheus",
}
PROMETHEUS_NAMESPACE = {"fleet-pipelines.io/prometheus": "true"}
ELSEWHERE = "Prometheus in an unlabelled namespace"

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
        ("metrics exporter", "fleet", template_labels(MONITORING, "Deployment", "fleet-metrics")),
        ("Prometheus", "monitoring", PROMETHEUS_LABELS),
        ("other pod beside Prometheus", "monitoring", {"app.kubernetes.io/name": "grafana"}),
        (ELSEWHERE, "default", PROMETHEUS_LABELS),
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
    # Outside the cluster: an address of each list of deploy/egress.example.yaml, and one of none.
    found += [(name, Endpoint(name, address)) for name, address in OUTSIDE.items()]
    return found


# An address in each list of deploy/egress.example.yaml (kind's control plane for the API).
OUTSIDE = {
    "object store": "52.216.8.1",
    "model source": "3.5.0.7",
    "git host": "140.82.112.3",
    "Kubernetes API": "172.18.0.2",
    "address outside every list": "93.184.216.34",
}


def deploy_cluster(example: bool = True) -> Cluster:
    """The policies of deploy/k8s, deploy/monitoring and deploy/node; with `example`, the
    operator's address list (deploy/k8s/egress.yaml) filled in as deploy/egress.example.yaml."""
    policies = of_kind(load_docs(K8S) + load_docs(MONITORING) + load_docs(NODE_DIR), "NetworkPolicy")
    if example:
        filled = {p["metadata"]["name"]: p for p in EGRESS_EXAMPLE}
        policies = [filled.get(p["metadata"]["name"], p) for p in policies]
    namespaces = {
        "fleet": {},
        "kube-system": {},
        "default": {},
        "kuberay-system": {},
        "fleet-node": {},
        "monitoring": PROMETHEUS_NAMESPACE,
    }
    return Cluster(namespaces, policies)


def in_table(
    source: str, source_ns: str | None, destination: str, destination_ns: str | None, probe: tuple[str, int]
) -> bool:
    for sources, destinations, ports in table_rows():
        from_ok = source in sources or ("every pod in fleet" in sources and source_ns == "fleet")
        if from_ok and destination in destinations and (ports is None or probe in ports):
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
    known = set(COMPONENT.values()) | {"every pod in fleet"}
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
        if ok
        and NAMESPACE[b] in ("fleet", "fleet-node")
        and NAMESPACE[a] != "fleet"
        and not in_table(COMPONENT[a], NAMESPACE[a], COMPONENT[b], NAMESPACE[b], (proto, port))
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
            if COMPONENT[b] not in destinations:
                continue
            for probe in sorted(ports) if ports is not None else PROBES:
                if not FLOWS[(a, b, *probe)]:
                    missing.append((a, b, probe))
    assert missing == [], missing


@pytest.mark.parametrize(
    "outsider",
    [
        "other pod in fleet",
        "pod in another namespace",
        "KubeRay operator",
        "other pod beside Prometheus",
        ELSEWHERE,
    ],
)
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


RAY = ("Ray head", "Ray worker", "Ray gpu worker")


def test_ray_accepts_clients_only_on_ray_client_port_and_only_from_dagster():
    """Ray's GCS, dashboard / Jobs API and raylets are reachable only from Ray's own pods; Ray Client
    (10001) from the runs and the code server, which present the token; Prometheus scrapes the
    metrics port (8080) and nothing else."""
    for (a, b, proto, port), ok in FLOWS.items():
        if ok and COMPONENT[b] in RAY and COMPONENT[a] not in RAY:
            assert (COMPONENT[a], COMPONENT[b], proto, port) in {
                ("run pod", "Ray head", "TCP", 10001),
                ("code server", "Ray head", "TCP", 10001),
                *(("Prometheus", ray, "TCP", 8080) for ray in RAY),
            }


def test_the_node_installer_has_no_network():
    (name,) = [n for n, c in COMPONENT.items() if c == "node installer"]
    assert not any(ok for (a, b, _, _), ok in FLOWS.items() if name in (a, b))


def test_the_components_are_found_by_the_labels_the_table_names():
    """deploy/flows.yaml's `components` select exactly the pods of that name here."""
    for name, endpoint in universe():
        if endpoint.namespace is None:
            continue
        selected = {
            c for c, labels in FLOW_TABLE["components"].items() if labels.items() <= endpoint.labels.items()
        }
        if name == ELSEWHERE:  # Prometheus's pods, outside the namespace the policies name
            name = "Prometheus"
        assert selected == ({name} if name in FLOW_TABLE["components"] else set()), (name, selected)


def test_as_shipped_no_pod_reaches_an_address_outside_the_cluster():
    """The operator's list is empty until filled in: every egress.yaml policy admits nothing."""
    cluster = deploy_cluster(example=False)
    endpoints = [e for _, e in universe()]
    reached = sorted(
        (COMPONENT[a.name], b.name, proto, port)
        for a in endpoints
        for b in endpoints
        if b.namespace is None and a.namespace in ("fleet", "fleet-node")
        for proto, port in PROBES
        if cluster.connects(a, b, proto, port)
    )
    assert reached == []
    shipped = of_kind(load_docs(K8S), "NetworkPolicy")
    assert all(
        p["spec"]["egress"] == [] for p in shipped if p["metadata"]["name"] in FLOW_TABLE["outside"].values()
    )


def test_the_example_list_differs_from_the_shipped_one_only_in_its_addresses():
    """Each list of deploy/egress.example.yaml selects the pods the shipped policy selects, and
    each of its rules names its addresses (a rule without `to` would admit every address) as
    ipBlocks, none of them everything."""
    shipped = {p["metadata"]["name"]: p for p in of_kind(load_docs(K8S), "NetworkPolicy")}
    assert {p["metadata"]["name"] for p in EGRESS_EXAMPLE} == set(FLOW_TABLE["outside"].values())
    for policy in EGRESS_EXAMPLE:
        mine = shipped[policy["metadata"]["name"]]
        assert policy["spec"]["podSelector"] == mine["spec"]["podSelector"]
        assert policy["spec"]["policyTypes"] == mine["spec"]["policyTypes"] == ["Egress"]
        for rule in policy["spec"]["egress"]:
            assert rule["to"] and all(set(peer) == {"ipBlock"} for peer in rule["to"]), rule
            assert all(peer["ipBlock"]["cidr"] not in ("0.0.0.0/0", "::/0") for peer in rule["to"])


def test_no_policy_but_the_operators_list_reaches_an_address():
    """ipBlocks appear only in deploy/k8s/egress.yaml (the operator's one place)."""
    for policy in of_kind(load_docs(K8S) + load_docs(MONITORING), "NetworkPolicy"):
        if policy["metadata"]["name"] in FLOW_TABLE["outside"].values():
            continue
        rules = [*policy["spec"].get("egress", []), *policy["spec"].get("ingress", [])]
        peers = [peer for rule in rules for peer in (rule.get("to") or rule.get("from") or [])]
        assert all("ipBlock" not in peer for peer in peers), policy["metadata"]["name"]


def render_table() -> str:
    """deploy/flows.yaml's table as deploy/README.md shows it."""
    lines = ["| from | to | port | why |", "|---|---|---|---|"]
    for flow in FLOW_TABLE["flows"]:
        ports = flow["ports"] if isinstance(flow["ports"], str) else ", ".join(flow["ports"])
        lines.append(f"| {', '.join(flow['from'])} | {', '.join(flow['to'])} | {ports} | {flow['why']} |")
    return "\n".join(lines)


def test_the_readme_shows_the_flow_table():
    section = README.split("## Network", 1)[1].split("\n## ", 1)[0]
    assert render_table() in section, render_table()
