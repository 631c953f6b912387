"""The kind overlay (deploy/kind), the first-apply target: what `kubectl apply -k deploy/kind`
sends, rendered by kubectl's own kustomize, holds the whole system in the form kind can run (the
CPU engine, the seccomp-only sandbox tier, a PostgreSQL, a shared volume instead of object
storage), and changes nothing else: the same pods, admitted at `restricted`, the same network
policies, and the Dagster instance differs from deploy/dagster's only where kind needs it.
No kind cluster runs here (no network to pull images): deploy/README.md says what was checked how."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from . import test_deploy_admission as admission
from .deploy_objects import (
    DAGSTER_DIR,
    DEPLOY,
    INSTANCE,
    NATS_VALUES,
    README,
    containers,
    launched_run_job,
    load,
    load_all,
    nats_pods,
    workload_pods,
)
from .test_deploy_security import violations

KIND = DEPLOY / "kind"


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its built-in kustomize renders the overlay)")
    done = subprocess.run([kubectl, "kustomize", str(KIND)], capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_the_kind_instance_differs_from_the_base_only_where_kind_needs_it():
    kind = load((KIND / "dagster.yaml").read_text())
    expected = copy.deepcopy(INSTANCE)
    run = expected["run_launcher"]["config"]["run_k8s_config"]
    del run["container_config"]["securityContext"]["appArmorProfile"]
    run["pod_spec_config"]["volumes"].append(
        {"name": "shared", "persistentVolumeClaim": {"claimName": "fleet-shared"}}
    )
    run["container_config"]["volumeMounts"].append({"name": "shared", "mountPath": "/shared"})
    expected["compute_logs"] = {
        "module": "dagster.core.storage.noop_compute_log_manager",
        "class": "NoOpComputeLogManager",
    }
    assert kind == expected


def test_kind_runs_the_cpu_engine_and_no_apparmor_profile(rendered: list[dict[str, Any]]):
    deployments = {d["metadata"]["name"] for d in rendered if d["kind"] == "Deployment"}
    assert "fleet-vllm" not in deployments and "fleet-llamacpp" in deployments
    assert "appArmorProfile" not in yaml.safe_dump(rendered)
    assert not [d for d in rendered if d["kind"] == "Secret"]
    config = named(rendered, "ConfigMap", "fleet-config")["data"]
    assert config["FLEET_LLM_MODEL"] == "SmolLM2-135M-Instruct" and config["FLEET_ENGINE_SLOTS"] == "4"
    assert config["FLEET_STORAGE_PATH"].startswith("/shared/")
    instance = load(named(rendered, "ConfigMap", "dagster-instance")["data"]["dagster.yaml"])
    assert instance == load((KIND / "dagster.yaml").read_text())


def test_every_kind_pod_is_admitted_at_restricted_and_the_scoring_pods_keep_their_seccomp_profile(
    rendered: list[dict[str, Any]],
):
    pods = workload_pods(rendered)
    assert {o for o, _ in pods} >= {
        "Deployment/postgres",
        "Deployment/fleet-llamacpp",
        "Deployment/fleet-pipelines",
        "RayCluster/cpu",
    }
    for owner, pod in pods:
        for version in ((1, 33), (1, 34), (1, 35)):
            assert violations(pod, "restricted", version) == {}, owner
    for owner in ("RayCluster/cpu", "RayCluster/gpu"):
        pod = dict(pods)[owner]
        context = pod["containers"][0]["securityContext"]
        assert context["seccompProfile"] == {"type": "Localhost", "localhostProfile": "fleet-sandbox.json"}
        assert pod["hostUsers"] is False


def test_the_kind_worker_is_the_sandbox_node(rendered: list[dict[str, Any]]):
    cluster = load((KIND / "cluster.yaml").read_text())
    (worker,) = [n for n in cluster["nodes"] if n["role"] == "worker"]
    for owner, pod in workload_pods(rendered):
        for key, value in (pod.get("nodeSelector") or {}).items():
            if key.startswith("fleet-pipelines.io/"):
                assert worker["labels"][key] == value, owner
    assert all("@sha256:" in n["image"] for n in cluster["nodes"])


def test_the_postgresql_of_kind_is_the_one_the_network_policies_admit(rendered: list[dict[str, Any]]):
    pod = dict(workload_pods(rendered))["Deployment/postgres"]
    labels = named(rendered, "Deployment", "postgres")["spec"]["template"]["metadata"]["labels"]
    assert labels["fleet-pipelines.io/component"] == "postgresql"
    (container,) = containers(pod)
    assert {p["containerPort"] for p in container["ports"]} == {5432}
    (pg,) = [d for d in load_all((DAGSTER_DIR / "components.yaml").read_text()) if d["kind"] == "ConfigMap"]
    assert pg["data"]["DAGSTER_PG_HOST"] == "postgres.fleet.svc"
    assert named(rendered, "Service", "postgres")["spec"]["ports"][0]["port"] == 5432


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity (cores, bytes) as a number."""
    text = str(value)
    for suffix, factor in (("m", 1e-3), ("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30)):
        if text.endswith(suffix):
            return float(text.removesuffix(suffix)) * factor
    return float(text)


def pod_requests(pod: dict[str, Any]) -> tuple[float, float]:
    """(CPU, memory) the scheduler counts for a pod: the sum of its containers' requests, or its
    largest init container's where that is more (k8s.io/component-helpers resource.PodRequests)."""

    def total(key: str) -> float:
        main = sum(
            quantity(c.get("resources", {}).get("requests", {}).get(key, 0)) for c in pod["containers"]
        )
        init = [
            quantity(c.get("resources", {}).get("requests", {}).get(key, 0))
            for c in pod.get("initContainers", [])
        ]
        return max(main, *init) if init else main

    return total("cpu"), total("memory")


# Pods beside ours on the kind worker, with the requests of their pinned releases: the NATS chart's
# server (our values, one server on kind), the KubeRay operator (chart 1.7.0's values:
# resources.limits 100m / 512Mi, requests defaulting to them) and kindnet (kind 0.29's manifest:
# 100m / 50Mi).
BESIDE = {"KubeRay operator": (0.1, 512 * 2**20), "kindnet": (0.1, 50 * 2**20)}


def test_the_kind_worker_fits_the_readmes_host_with_two_runs_and_the_autoscalers_workers(
    rendered: list[dict[str, Any]],
):
    """Everything on the one kind worker (the control plane keeps its taint): the overlay's pods,
    the Ray head with its autoscaler, the cpu group at maxReplicas, two run pods as dagster-k8s
    builds them from the kind instance, NATS, the KubeRay operator and kindnet, requesting no more
    than the host deploy/README.md names. The gpu group is left out: its pods request
    nvidia.com/gpu, which no kind node has, and nothing on kind asks for a GPU."""
    cpus, gib = map(int, re.search(r"(\d+) CPUs and (\d+) GiB free", README).groups())
    pods = dict(workload_pods(rendered))
    (cluster,) = [d for d in rendered if d["kind"] == "RayCluster"]
    (cpu_group,) = [g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "cpu"]
    autoscaler = {"containers": [{"resources": cluster["spec"]["autoscalerOptions"]["resources"]}]}
    kind_instance = load((KIND / "dagster.yaml").read_text())
    run = launched_run_job(kind_instance["run_launcher"]["config"], None)["spec"]["template"]["spec"]
    (nats,) = [spec for owner, spec in nats_pods(NATS_VALUES) if owner == "chart/nats"]
    counted = [(owner, pod_requests(pod)) for owner, pod in pods.items() if owner != "RayCluster/gpu"]
    counted += [("Ray autoscaler", pod_requests(autoscaler))]
    counted += [("RayCluster/cpu (autoscaled)", pod_requests(pods["RayCluster/cpu"]))] * (
        cpu_group["maxReplicas"] - 1
    )
    counted += [("run pod", pod_requests(run))] * 2
    counted += [("NATS", pod_requests(nats)), *BESIDE.items()]
    cpu = sum(c for _, (c, _) in counted)
    memory = sum(m for _, (_, m) in counted)
    assert cpu <= cpus and memory <= gib * 2**30, (cpu, memory / 2**30, counted)
    assert cpu_group["maxReplicas"] >= 2  # a second worker fits, not only the first


def test_the_kind_run_pod_is_admitted_by_the_kind_policy_and_a_widened_one_is_not(
    rendered: list[dict[str, Any]],
):
    """The kind overlay's admission policy (its run image by tag, its shared volume) admits the run
    Job dagster-k8s builds from kind's instance, and still refuses another claim or image."""
    (policy,) = [d for d in rendered if d["kind"] == "ValidatingAdmissionPolicy"]
    kind_instance = load((KIND / "dagster.yaml").read_text())
    job = launched_run_job(kind_instance["run_launcher"]["config"], None)
    assert admission.refusals(job, policy=policy) == []
    other_claim = copy.deepcopy(job)
    other_claim["spec"]["template"]["spec"]["volumes"].append(
        {"name": "x", "persistentVolumeClaim": {"claimName": "data"}}
    )
    assert admission.refusals(other_claim, policy=policy) != []
    other_image = copy.deepcopy(job)
    other_image["spec"]["template"]["spec"]["containers"][0]["image"] = "busybox:1.37.0"
    assert admission.refusals(other_image, policy=policy) != []
