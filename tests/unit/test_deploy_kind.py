"""The kind overlay (deploy/kind), the first-apply target: what `kubectl apply -k deploy/kind`
sends, rendered by kubectl's own kustomize, holds the whole system in the form kind can run (the
CPU engine, the seccomp-only sandbox tier, a PostgreSQL, a shared volume instead of object
storage), and changes nothing else: the same pods, admitted at `restricted`, the same network
policies, and the Dagster instance differs from deploy/dagster's only where kind needs it.
No kind cluster runs here (no network to pull images): deploy/README.md says what was checked how."""

from __future__ import annotations

import copy
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from .deploy_objects import DAGSTER_DIR, DEPLOY, INSTANCE, containers, load, load_all, workload_pods
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
