"""The run launcher cannot be abused: deploy/k8s/run-admission.yaml's ValidatingAdmissionPolicy,
evaluated with cel-python (a CEL evaluator from PyPI, core CEL as the cel-spec defines it) in a
harness that reproduces what the API server's admission gives the policy: its matchConstraints
(resources, operations, the namespace), its matchConditions, then `variables` in order, then each
validation, over `object` and `request.userInfo` (k8s.io/apiserver
pkg/admission/plugin/policy/validating, v1.33). An expression that fails to evaluate refuses the
object, as `failurePolicy: Fail` does. The run Job is the one dagster-k8s's own `launch_run`
builds from each route's run launcher (deploy_objects.build_run_job): it is admitted; every way to
widen it (another Secret, image, command or service account, a token, a volume type, privilege,
another node) is refused."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from typing import Any

import celpy
import pytest

from .deploy_objects import K8S, VALUES, chart_run_job, instance_run_job, load_docs, of_kind

(POLICY,) = of_kind(load_docs(K8S), "ValidatingAdmissionPolicy")
(BINDING,) = of_kind(load_docs(K8S), "ValidatingAdmissionPolicyBinding")
LAUNCHER = "system:serviceaccount:fleet:dagster"
RESOURCES = {("batch", "Job"): "jobs", ("batch", "CronJob"): "cronjobs", ("", "Pod"): "pods"}
ENV = celpy.Environment()


@functools.cache
def program(expression: str) -> Any:
    """The policy's expression, compiled once (lark's parse: ~2 ms each, ~20 of them per object
    judged); each evaluation runs on a fresh evaluator and activation."""
    return ENV.program(ENV.compile(expression))


def matches(obj: dict[str, Any], operation: str, policy: dict[str, Any]) -> bool:
    """matchConstraints: a resource rule for the object's group, resource and the operation, in a
    namespace the namespaceSelector selects (by its name label)."""
    group = obj["apiVersion"].rpartition("/")[0]
    resource = RESOURCES.get((group, obj["kind"]))
    constraints = policy["spec"]["matchConstraints"]
    namespace = {"kubernetes.io/metadata.name": obj["metadata"].get("namespace", "fleet")}
    if constraints["namespaceSelector"]["matchLabels"].items() - namespace.items():
        return False
    return any(
        group in rule["apiGroups"] and resource in rule["resources"] and operation in rule["operations"]
        for rule in constraints["resourceRules"]
    )


def passes(expression: str, names: dict[str, Any]) -> bool:
    """True only when the expression evaluates to true; an error is not true (failurePolicy Fail)."""
    try:
        result = program(expression).evaluate(names)
    except celpy.CELEvalError:
        return False
    return isinstance(result, celpy.celtypes.BoolType) and bool(result)


def refusals(
    obj: dict[str, Any], username: str = LAUNCHER, operation: str = "CREATE", policy: dict[str, Any] = POLICY
) -> list[str]:
    """The messages `policy` refuses `obj` with ([]: admitted), as its binding (Deny) applies it."""
    if not matches(obj, operation, policy):
        return []
    request = {"operation": operation, "userInfo": {"username": username, "groups": []}}
    names: dict[str, Any] = {"object": celpy.json_to_cel(obj), "request": celpy.json_to_cel(request)}
    spec = policy["spec"]
    names["variables"] = celpy.celtypes.MapType({})
    if not all(passes(c["expression"], names) for c in spec.get("matchConditions", [])):
        return []
    for variable in spec.get("variables", []):
        try:
            value = program(variable["expression"]).evaluate(names)
        except celpy.CELEvalError as error:
            value = error  # used by a validation, it fails it
        names["variables"] = celpy.celtypes.MapType(
            {**names["variables"], celpy.celtypes.StringType(variable["name"]): value}
        )
    return [v["message"] for v in spec["validations"] if not passes(v["expression"], names)]


def run_jobs() -> list[tuple[str, dict[str, Any]]]:
    return [("plain", instance_run_job()), ("chart", chart_run_job(VALUES))]


def as_pod(job: dict[str, Any]) -> dict[str, Any]:
    template = job["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "namespace": "fleet"},
        "spec": template["spec"],
    }


def as_cronjob(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "run", "namespace": "fleet"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": job["spec"]}},
    }


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def container(obj: dict[str, Any]) -> dict[str, Any]:
    return pod_spec(obj)["containers"][0]


def add_volume(volume: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda job: pod_spec(job)["volumes"].append({"name": "extra", **volume})


WIDENINGS: dict[str, Callable[[dict[str, Any]], None]] = {
    "another image": lambda j: container(j).update(image="docker.io/library/python:3.11"),
    "an init container of another image": lambda j: pod_spec(j).update(
        initContainers=[{**copy.deepcopy(container(j)), "name": "init", "image": "busybox"}]
    ),
    "a command": lambda j: container(j).update(command=["sh", "-c", "cat /var/run/secrets/*"]),
    "other args": lambda j: container(j).update(args=["/opt/venv/bin/python", "-c", "print(1)"]),
    "another dagster command": lambda j: container(j)["args"].__setitem__(4, "grpc"),
    "another service account": lambda j: pod_spec(j).update(serviceAccountName="dagster"),
    "a mounted token": lambda j: pod_spec(j).update(automountServiceAccountToken=True),
    "no word on the token": lambda j: pod_spec(j).pop("automountServiceAccountToken"),
    "another Secret as a volume": add_volume({"secret": {"secretName": "dagster-postgresql-secret"}}),
    "a projected service-account token": add_volume(
        {"projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
    ),
    "a projected Secret": add_volume({"projected": {"sources": [{"secret": {"name": "fleet-ray-token"}}]}}),
    "a CSI volume": add_volume({"csi": {"driver": "secrets-store.csi.k8s.io"}}),
    "a PVC": add_volume({"persistentVolumeClaim": {"claimName": "data"}}),
    "kind's shared volume (not on this route)": add_volume(
        {"persistentVolumeClaim": {"claimName": "fleet-shared"}}
    ),
    "an ephemeral PVC": add_volume({"ephemeral": {"volumeClaimTemplate": {"spec": {}}}}),
    "a host path": add_volume({"hostPath": {"path": "/"}}),
    "another Secret through envFrom": lambda j: container(j)["envFrom"].append(
        {"secretRef": {"name": "fleet-ray-token"}}
    ),
    "another Secret through secretKeyRef": lambda j: container(j)["env"].append(
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "fleet-s3", "key": "credentials"}}}
    ),
    "a node name": lambda j: pod_spec(j).update(nodeName="control-plane"),
    "no sandbox node selector": lambda j: pod_spec(j).pop("nodeSelector"),
    "another node selector": lambda j: pod_spec(j).update(nodeSelector={"kubernetes.io/os": "linux"}),
    "host users": lambda j: pod_spec(j).update(hostUsers=True),
    "the host network": lambda j: pod_spec(j).update(hostNetwork=True),
    "the host PID namespace": lambda j: pod_spec(j).update(hostPID=True),
    "privileged": lambda j: container(j)["securityContext"].update(privileged=True),
    "privilege escalation": lambda j: container(j)["securityContext"].update(allowPrivilegeEscalation=True),
    "an added capability": lambda j: container(j)["securityContext"].update(
        capabilities={"add": ["SYS_ADMIN"]}
    ),
    "a host port": lambda j: container(j).update(ports=[{"containerPort": 80, "hostPort": 80}]),
}


@pytest.mark.parametrize(("route", "job"), run_jobs(), ids=[r for r, _ in run_jobs()])
def test_the_run_pod_dagster_k8s_builds_is_admitted(route: str, job: dict[str, Any]):
    assert refusals(job) == []
    assert refusals(as_pod(job)) == []
    assert refusals(as_cronjob(job)) == []


@pytest.mark.parametrize("widening", sorted(WIDENINGS))
@pytest.mark.parametrize("shape", ["Job", "Pod", "CronJob"])
def test_every_widening_of_the_run_pod_is_refused(widening: str, shape: str):
    job = instance_run_job()
    WIDENINGS[widening](job)
    obj = {"Job": job, "Pod": as_pod(job), "CronJob": as_cronjob(job)}[shape]
    assert refusals(obj) != []


def test_only_the_run_launchers_objects_in_fleet_are_judged():
    """Other accounts (KubeRay's operator creating Ray pods, the Job controller creating the run
    Job's pod, an admin) and other namespaces are this policy's business neither way."""
    job = instance_run_job()
    WIDENINGS["a host path"](job)
    assert refusals(job, username="system:serviceaccount:kube-system:job-controller") == []
    assert refusals({**job, "metadata": {**job["metadata"], "namespace": "default"}}) == []
    assert refusals(job, operation="UPDATE") != []
    assert refusals(job, operation="DELETE") == []


def test_the_policy_is_core_cel_and_denies():
    """Each expression compiles in cel-python (the cel-spec's core language and standard macros);
    none calls a function of Kubernetes' CEL libraries (k8s.io/apiserver/pkg/cel/library) or the
    cel-go extensions the API server adds (strings, sets, lists)."""
    spec = POLICY["spec"]
    expressions = [
        *(c["expression"] for c in spec["matchConditions"]),
        *(v["expression"] for v in spec["variables"]),
        *(v["expression"] for v in spec["validations"]),
    ]
    extensions = (
        r"\.(isSorted|sum|min|max|indexOf|lastIndexOf|find|findAll|split|join|lowerAscii|upperAscii"
        r"|replace|trim|substring|charAt|format|quote|reverse|sets|getScheme|getHost|isQuantity|asInteger)\("
        r"|\b(url|quantity|ip|cidr|isURL|isIP|isCIDR|authorizer|sets\.\w+|lists\.\w+|strings\.\w+)\("
    )
    for expression in expressions:
        program(expression)
        assert not re.search(extensions, expression), expression
    assert spec["failurePolicy"] == "Fail"
    assert POLICY["apiVersion"] == BINDING["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert {r for rule in spec["matchConstraints"]["resourceRules"] for r in rule["resources"]} == {
        "jobs",
        "cronjobs",
        "pods",
    }
