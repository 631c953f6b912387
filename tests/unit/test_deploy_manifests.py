"""deploy/k8s validates offline: core objects against the Kubernetes schemas shipped by
kubernetes-validate (strict: unknown fields fail), the KubeRay RayCluster against the schema in
tests/unit/schemas plus each of its pod templates against Kubernetes' PodTemplateSpec; and the
objects agree with each other and with the code (names referenced exist, env names are read)."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = Path(__file__).parent / "schemas"
KUBERNETES_VERSION = "1.33"  # oldest Kubernetes the manifests target
IMAGE_REPOSITORY = "registry.example.com/fleet-pipelines"


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in manifests() if d["kind"] == kind]


def raycluster() -> dict[str, Any]:
    (cluster,) = by_kind("RayCluster")
    return cluster


def raycluster_errors(cluster: dict[str, Any]) -> list[str]:
    """Every schema error of a RayCluster: its own fields, then each pod template's."""
    schema = yaml.safe_load((SCHEMAS / "raycluster.schema.yaml").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(cluster)]
    spec = cluster.get("spec", {})
    groups = [("head", spec.get("headGroupSpec", {}))] + [
        (g.get("groupName", "?"), g) for g in spec.get("workerGroupSpecs", [])
    ]
    for name, group in groups:
        errors += k8s_errors(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": name},
                "template": group["template"],
            }
        )
    return errors


def k8s_errors(doc: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{doc['kind']}/{doc['metadata']['name']} {list(exc.absolute_path)}: {exc.message}"]
    return []


def pod_templates() -> list[tuple[str, dict[str, Any]]]:
    """(owner, pod template) of every workload in deploy/k8s."""
    cluster = raycluster()
    templates = [("raycluster/head", cluster["spec"]["headGroupSpec"]["template"])]
    templates += [
        (f"raycluster/{g['groupName']}", g["template"]) for g in cluster["spec"]["workerGroupSpecs"]
    ]
    templates += [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]) for d in by_kind("Deployment")
    ]
    templates += [(f"Job/{d['metadata']['name']}", d["spec"]["template"]) for d in by_kind("Job")]
    return templates


def containers() -> list[tuple[str, dict[str, Any]]]:
    return [(owner, c) for owner, t in pod_templates() for c in t["spec"]["containers"]]


@pytest.mark.parametrize(
    "doc", [d for d in manifests() if d["kind"] != "RayCluster"], ids=lambda d: d["kind"]
)
def test_core_objects_validate_against_the_kubernetes_schema(doc):
    assert k8s_errors(doc) == []


def test_raycluster_validates_against_kuberay_and_pod_schemas():
    assert raycluster_errors(raycluster()) == []


def test_validation_catches_typos():
    """The checks are strict: a misspelt field fails in the RayCluster and in a pod template."""
    cluster = raycluster()
    typo = copy.deepcopy(cluster)
    typo["spec"]["workerGroupSpec"] = typo["spec"].pop("workerGroupSpecs")
    assert any("workerGroupSpec" in e for e in raycluster_errors(typo))
    typo = copy.deepcopy(cluster)
    typo["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resource"] = {}
    assert any("resource" in e for e in raycluster_errors(typo))
    typo = copy.deepcopy(cluster)
    typo["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0  # must be a string
    assert raycluster_errors(typo)


def test_kustomization_applies_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_ray_version_matches_the_pinned_ray():
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray_pin,) = [p for p in pins if p.startswith("ray[")]
    minor = re.search(r"==(\d+\.\d+)", ray_pin).group(1)
    assert raycluster()["spec"]["rayVersion"].startswith(minor + ".")
    ports = {
        p["containerPort"]
        for p in raycluster()["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert 10001 in ports  # Ray Client: RAY_ADDRESS=ray://...:10001 in fleet-config
    (config,) = by_kind("ConfigMap")
    assert config["data"]["RAY_ADDRESS"].endswith(":10001")


def test_one_image_everywhere_gpu_variant_only_where_gpus_are_requested():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for owner, container in containers():
        repository, tag = container["image"].rsplit(":", 1)
        assert repository == IMAGE_REPOSITORY, owner
        wants_gpu = "nvidia.com/gpu" in container["resources"].get("limits", {})
        assert tag == (f"{version}-gpu" if wants_gpu else version), owner
    gpu_owners = {o for o, c in containers() if "nvidia.com/gpu" in c["resources"].get("limits", {})}
    assert gpu_owners == {"raycluster/gpu", "Deployment/fleet-vllm"}


def test_every_referenced_configmap_secret_and_key_exists():
    data = {("ConfigMap", d["metadata"]["name"]): set(d["data"]) for d in by_kind("ConfigMap")}
    data |= {("Secret", d["metadata"]["name"]): set(d["stringData"]) for d in by_kind("Secret")}
    claims = {d["metadata"]["name"] for d in by_kind("PersistentVolumeClaim")}
    for owner, container in containers():
        for source in container.get("envFrom", []):
            kind, ref = (
                ("ConfigMap", source["configMapRef"])
                if "configMapRef" in source
                else ("Secret", source["secretRef"])
            )
            assert (kind, ref["name"]) in data, owner
        for env in container.get("env", []):
            for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                if ref := env.get("valueFrom", {}).get(key):
                    assert ref["key"] in data[(kind, ref["name"])], (owner, env["name"])
    for owner, template in pod_templates():
        for volume in template["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, owner


def test_config_names_are_read_by_the_code_and_secrets_hold_no_values():
    source = "\n".join(p.read_text() for p in (ROOT / "fleet_pipelines").rglob("*.py"))
    (config,) = by_kind("ConfigMap")
    for name in config["data"]:
        assert f'"{name}"' in source, f"{name} is set in fleet-config but no code reads it"
    assert config["data"]["FLEET_ENGINE_BACKEND"] in {"openai", "vllm_actor"}
    for secret in by_kind("Secret"):
        if secret["metadata"]["name"].startswith("fleet-"):  # the others are read by Dagster's chart
            for key in secret["stringData"]:
                assert f'"{key}"' in source, f"{key} is in a Secret but no code reads it"
        for key, value in secret["stringData"].items():
            if re.search("PASSWORD|KEY|password", key):
                assert value == "REPLACE_ME", f"{secret['metadata']['name']}/{key} must not be committed"


def test_nats_init_job_runs_fleet_nats_init_from_the_one_image():
    (job,) = by_kind("Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["fleet", "nats", "init"]
    refs = {s.get("secretRef", {}).get("name") for s in container["envFrom"]}
    assert "fleet-nats" in refs
