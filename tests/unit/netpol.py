"""Kubernetes NetworkPolicy (networking.k8s.io/v1) semantics, as the API documents them and as
upstream's conformance tests check them, for the deploy tests: which connections a set of
policies lets through. No network plugin runs here, so this is the decision a conforming plugin
makes, written from the API reference (k8s.io/api/networking/v1/types.go) and checked against
upstream's own e2e truth tables (tests/unit/schemas/netpol-upstream-cases.yaml, carried from
kubernetes test/e2e/network/netpol/network_policy.go; tests/unit/test_deploy_network.py runs them).

A connection from a source to a destination on (protocol, port) is allowed when both ends allow it:
* egress of the source (if it is a pod): no policy of its namespace selects it for Egress, or one
  of those policies' egress rules matches the destination and the port;
* ingress of the destination (if it is a pod): the same with Ingress rules and the source.
A rule with no peers matches every peer, with no ports every port; peers and ports are each ORed;
in one peer, namespaceSelector AND podSelector; a podSelector alone means the policy's namespace;
an ipBlock matches an address in its CIDR and outside its excepts. A numbered port matches that
port (up to endPort), a named one the destination pod's container port of that name and protocol;
the protocol defaults to TCP. policyTypes defaults to Ingress, plus Egress when egress rules exist.
ipBlocks here also match pod addresses (which the API leaves to the plugin): the wider reading, so
a test that finds a flow closed finds it closed on every plugin."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

Selector = dict[str, Any]


def selects(selector: Selector | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector: matchLabels AND every matchExpression; {} selects everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


@dataclass(frozen=True)
class Endpoint:
    """A pod (namespace set) or an address outside the cluster (namespace None)."""

    name: str
    ip: str
    namespace: str | None = None
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    # container ports: (name, protocol, number)
    ports: tuple[tuple[str, str, int], ...] = ()


@dataclass
class Cluster:
    namespaces: dict[str, dict[str, str]]  # name -> labels
    policies: list[dict[str, Any]]

    def namespace_labels(self, name: str) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": name, **self.namespaces.get(name, {})}

    def policy_types(self, policy: dict[str, Any]) -> set[str]:
        spec = policy["spec"]
        if spec.get("policyTypes"):
            return set(spec["policyTypes"])
        return {"Ingress"} | ({"Egress"} if spec.get("egress") else set())

    def peer_matches(self, peer: dict[str, Any], policy_namespace: str, other: Endpoint) -> bool:
        if "ipBlock" in peer:
            block = peer["ipBlock"]
            address = ipaddress.ip_address(other.ip)
            return address in ipaddress.ip_network(block["cidr"]) and not any(
                address in ipaddress.ip_network(e) for e in block.get("except") or []
            )
        if other.namespace is None:
            return False  # selectors select pods only
        if "namespaceSelector" in peer:
            if not selects(peer["namespaceSelector"], self.namespace_labels(other.namespace)):
                return False
        elif other.namespace != policy_namespace:
            return False
        return selects(peer.get("podSelector", {}), other.labels)

    @staticmethod
    def port_matches(rule_port: dict[str, Any], destination: Endpoint, protocol: str, port: int) -> bool:
        if rule_port.get("protocol", "TCP") != protocol:
            return False
        if "port" not in rule_port or rule_port["port"] is None:
            return True
        wanted = rule_port["port"]
        if isinstance(wanted, str):
            # a named port: the destination pod's container port of that name and protocol
            return any(n == wanted and p == protocol and number == port for n, p, number in destination.ports)
        return wanted <= port <= rule_port.get("endPort", wanted)

    def allowed_by(
        self,
        direction: str,
        subject: Endpoint,
        other: Endpoint,
        destination: Endpoint,
        protocol: str,
        port: int,
    ) -> bool:
        """Whether `subject`'s policies of `direction` (Ingress: other is the source; Egress: other
        is the destination) let the connection through."""
        if subject.namespace is None:
            return True  # not a pod: no policy applies
        selecting = [
            p
            for p in self.policies
            if p["metadata"]["namespace"] == subject.namespace
            and selects(p["spec"]["podSelector"], subject.labels)
            and direction in self.policy_types(p)
        ]
        if not selecting:
            return True
        key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
        for policy in selecting:
            for rule in policy["spec"].get(key) or []:
                peers = rule.get(peers_key) or []
                ports = rule.get("ports") or []
                peer_ok = not peers or any(
                    self.peer_matches(peer, policy["metadata"]["namespace"], other) for peer in peers
                )
                port_ok = not ports or any(self.port_matches(rp, destination, protocol, port) for rp in ports)
                if peer_ok and port_ok:
                    return True
        return False

    def connects(self, source: Endpoint, destination: Endpoint, protocol: str, port: int) -> bool:
        return self.allowed_by(
            "Egress", source, destination, destination, protocol, port
        ) and self.allowed_by("Ingress", destination, source, destination, protocol, port)
