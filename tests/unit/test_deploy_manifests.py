"""The plain manifests validate offline: core objects against the Kubernetes schemas shipped by
kubernetes-validate (strict: unknown fields fail) at every Kubernetes version deploy/ supports,
the KubeRay RayCluster against tests/unit/schemas (written from the operator v1.7.0 CRD) plus each
of its pod templates against Kubernetes' PodTemplateSpec; and the objects agree with each other
and with the code (names referenced exist, env names are read, no Secret is applied)."""

from __future__ import annotations

import copy
import functools
import math
import re
import shutil
import subprocess
import tomllib
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from fleet_pipelines.domain.models import Task

from .deploy_objects import (
    DAGSTER_DIR,
    INSTANCE,
    K8S,
    KUBERAY_OPERATOR,
    NODE_DIR,
    ROOT,
    VALUES,
    containers,
    documented_secrets,
    load_all,
    load_docs,
    of_kind,
    raycluster,
    workload_pods,
)

SCHEMAS = ROOT / "tests" / "unit" / "schemas"
KUBERNETES_VERSIONS = ["1.33", "1.34", "1.35", "1.36", "1.37"]  # hostUsers and procMount need 1.33
IMAGE_REPOSITORY = "registry.example.com/fleet-pipelines"
ROUTES = {"k8s": K8S, "dagster": DAGSTER_DIR, "node": NODE_DIR}


# kubernetes-validate parses its schema files at every call (each version's _definitions.json is
# 1.4 MB: ~20 ms a call, ~5 s of the unit tier's CPU over its ~250 calls); each file is read once
# here. Every validation of the session goes through `validate`, which looks the function up in
# its module at each call, and neither it nor jsonschema changes a schema it is given.
kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)


def k8s_errors(doc: dict[str, Any], version: str) -> list[str]:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{doc['kind']}/{doc['metadata']['name']} {list(exc.absolute_path)}: {exc.message}"]
    return []


def strict(schema: Any) -> Any:
    """A structural schema as the API server applies it under strict field validation (kubectl's
    default): a field the schema does not name is an error, except under
    x-kubernetes-preserve-unknown-fields."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        open_ = schema.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in schema and "additionalProperties" not in schema and not open_:
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@functools.cache
def raycluster_validator() -> jsonschema.Draft202012Validator:
    """The RayCluster CRD's schema of the pinned operator (tests/unit/schemas), strict."""
    return jsonschema.Draft202012Validator(
        strict(yaml.safe_load((SCHEMAS / "raycluster.schema.yaml").read_text()))
    )


def raycluster_errors(cluster: dict[str, Any], version: str = KUBERNETES_VERSIONS[0]) -> list[str]:
    """Every schema error of a RayCluster: its own fields, then each pod template's."""
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in raycluster_validator().iter_errors(cluster)]
    spec = cluster.get("spec", {})
    groups = [("head", spec.get("headGroupSpec", {}))] + [
        (g.get("groupName", "?"), g) for g in spec.get("workerGroupSpecs", [])
    ]
    for name, group in groups:
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": name},
            "template": group["template"],
        }
        errors += k8s_errors(template, version)
    return errors


def core_objects() -> list[tuple[str, dict[str, Any]]]:
    return [
        (route, d) for route, path in ROUTES.items() for d in load_docs(path) if d["kind"] != "RayCluster"
    ]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    ("route", "doc"),
    core_objects(),
    ids=[f"{r}-{d['kind']}-{d['metadata']['name']}" for r, d in core_objects()],
)
def test_core_objects_validate_against_the_kubernetes_schema(route: str, doc: dict[str, Any], version: str):
    assert k8s_errors(doc, version) == []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_raycluster_validates_against_kuberay_and_pod_schemas(version: str):
    assert raycluster_errors(raycluster(), version) == []


def test_the_raycluster_schema_names_the_operator_version():
    assert f"v{KUBERAY_OPERATOR}" in (SCHEMAS / "raycluster.schema.yaml").read_text().splitlines()[0]


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
    typo = copy.deepcopy(cluster)
    typo["spec"]["authOptions"]["mode"] = "Token"  # the CRD's enum: disabled, token
    assert any("authOptions" in e for e in raycluster_errors(typo))
    typo = copy.deepcopy(cluster)
    typo["spec"]["autoscalerOptions"]["securityContex"] = typo["spec"]["autoscalerOptions"].pop(
        "securityContext"
    )
    assert any("securityContex" in e for e in raycluster_errors(typo))


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_kustomization_applies_every_manifest_and_no_secret(route: str):
    directory = ROUTES[route]
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    used = set(kustomization["resources"]) | {
        f for g in kustomization.get("configMapGenerator", []) for f in g["files"]
    }
    # Folders of components (k8s/engine/{gpu,cpu}: one is chosen here; k8s/sandbox/seccomp-only:
    # chosen by an overlay, deploy/kind): each applies all its files.
    folders = {p.name for p in directory.iterdir() if p.is_dir()}
    assert {c.split("/")[0] for c in kustomization.get("components", [])} <= folders
    assert used | folders == {p.name for p in directory.iterdir() if p.name != "kustomization.yaml"}
    for folder in folders:
        for component in (directory / folder).iterdir():
            own = yaml.safe_load((component / "kustomization.yaml").read_text())
            assert own["kind"] == "Component"
            assert set(own.get("resources", [])) == {p.name for p in component.iterdir()} - {
                "kustomization.yaml"
            }
            assert not of_kind(load_docs(component), "Secret")
    assert not of_kind(load_docs(directory), "Secret")


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_kubectl_kustomize_builds_no_secret_and_no_placeholder(route: str):
    """What `kubectl apply -k` would send: never a Secret, so an apply cannot reset credentials."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its built-in kustomize renders the kustomization)")
    built = subprocess.run(
        [kubectl, "kustomize", str(ROUTES[route])], capture_output=True, text=True, check=True
    )
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    assert docs and all(d["kind"] != "Secret" for d in docs)
    assert "REPLACE_ME" not in built.stdout
    assert sorted(d["kind"] for d in docs) == sorted(d["kind"] for d in load_docs(ROUTES[route]))


def test_ray_version_matches_the_pinned_ray_and_gets_http_probes():
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray_pin,) = [p for p in pins if p.startswith("ray[")]
    minor = re.search(r"==(\d+\.\d+)", ray_pin).group(1)
    version = raycluster()["spec"]["rayVersion"]
    assert version.startswith(minor + ".")
    # KubeRay >= 1.6 probes Ray >= 2.53 over HTTP; older Ray gets wget exec probes (not in the image).
    assert tuple(int(x) for x in version.split(".")[:2]) >= (2, 53)
    ports = {
        p["containerPort"]
        for p in raycluster()["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert 10001 in ports  # Ray Client: RAY_ADDRESS=ray://...:10001 in fleet-config
    (config,) = of_kind(load_docs(K8S), "ConfigMap")
    assert config["data"]["RAY_ADDRESS"].endswith(":10001")


def test_one_image_everywhere_gpu_variant_only_where_gpus_are_requested():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    gpu_owners = set()
    for route in ROUTES.values():
        for owner, pod in workload_pods(load_docs(route)):
            for container in containers(pod):
                if container["name"] in ("wait-gcs-ready", "autoscaler"):
                    continue  # added by the KubeRay operator, with the Ray container's image
                repository, tag = container["image"].split("@")[0].rsplit(":", 1)
                if owner == "DaemonSet/fleet-sandbox-profiles":
                    continue  # the node installer's minimal images (test_deploy_images.py)
                assert repository == IMAGE_REPOSITORY, owner
                wants_gpu = "nvidia.com/gpu" in container.get("resources", {}).get("limits", {})
                assert tag == (f"{version}-gpu" if wants_gpu else version), owner
                if wants_gpu:
                    gpu_owners.add(owner)
    assert gpu_owners == {"RayCluster/gpu", "Deployment/fleet-vllm"}


def test_every_referenced_configmap_secret_and_key_exists():
    """ConfigMaps come from the manifests, Secrets from deploy/README.md (created out of band)."""
    docs = [d for route in ROUTES.values() for d in load_docs(route)]
    data = {("ConfigMap", d["metadata"]["name"]): set(d["data"]) for d in of_kind(docs, "ConfigMap")}
    data |= {("Secret", name): keys for name, keys in documented_secrets().items()}
    for route in ROUTES.values():
        for owner, pod in workload_pods(load_docs(route)):
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for container in containers(pod):
                for source in container.get("envFrom", []):
                    kind, ref = (
                        ("ConfigMap", source["configMapRef"])
                        if "configMapRef" in source
                        else ("Secret", source["secretRef"])
                    )
                    assert (kind, ref["name"]) in data, (owner, ref["name"])
                for env in container.get("env", []):
                    for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                        if ref := env.get("valueFrom", {}).get(key):
                            assert ref["key"] in data[(kind, ref["name"])], (owner, env["name"])
                for mount in container.get("volumeMounts", []):
                    assert mount["name"] in volumes, (owner, mount["name"])
            for volume in volumes.values():
                if "configMap" in volume:
                    assert ("ConfigMap", volume["configMap"]["name"]) in data, owner
                assert "persistentVolumeClaim" not in volume, owner  # nothing waits on a provisioner


def test_config_names_are_read_by_the_code():
    source = "\n".join(p.read_text() for p in (ROOT / "fleet_pipelines").rglob("*.py"))
    (config,) = [d for d in of_kind(load_docs(K8S), "ConfigMap") if d["metadata"]["name"] == "fleet-config"]
    for name in config["data"]:
        if name in ("AWS_REGION", "AWS_ENDPOINT_URL_S3"):
            continue  # read by botocore (s3fs, dagster-aws)
        assert f'"{name}"' in source, f"{name} is set in fleet-config but no code reads it"
    assert config["data"]["FLEET_ENGINE_BACKEND"] in {"openai", "vllm_actor"}


def test_the_model_reaches_vllm_through_each_pods_own_scratch_volume():
    """Every pod that runs vLLM pulls the model folder from FLEET_MODEL_SOURCE in an init container
    onto an emptyDir (no storage class, no shared volume, nothing Pending) and loads it from
    FLEET_VLLM_MODEL; the node is chosen for its free disk (ephemeral-storage request)."""
    (config,) = of_kind(load_docs(K8S), "ConfigMap")
    model_dir = config["data"]["FLEET_VLLM_MODEL"]
    assert config["data"]["FLEET_MODEL_SOURCE"].startswith("s3://")
    pods = dict(workload_pods(load_docs(K8S)))
    pods |= dict(workload_pods(load_docs(K8S / "engine" / "cpu")))
    for owner in ("Deployment/fleet-vllm", "RayCluster/gpu", "Deployment/fleet-llamacpp"):
        pod = pods[owner]
        (pull,) = [c for c in pod["initContainers"] if c["name"] == "model-pull"]
        assert pull["command"] == ["fleet", "model", "pull"]
        # The S3 credentials file (test_deploy_env.py checks the mount behind the variable).
        assert {e["name"] for e in pull["env"]} == {"AWS_SHARED_CREDENTIALS_FILE"}
        (mount,) = [m for m in pull["volumeMounts"] if m["name"] == "models"]
        assert model_dir.startswith(mount["mountPath"] + "/") and not mount.get("readOnly")
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert "emptyDir" in volume and "medium" not in volume["emptyDir"]
        engine = pod["containers"][0]
        assert any(m["name"] == mount["name"] and m.get("readOnly") for m in engine["volumeMounts"])
        assert "ephemeral-storage" in engine["resources"]["requests"]
    args = pods["Deployment/fleet-vllm"]["containers"][0]["args"]
    assert "--model=$(FLEET_VLLM_MODEL)" in args
    # llama.cpp loads one GGUF file of that folder.
    args = pods["Deployment/fleet-llamacpp"]["containers"][0]["args"]
    assert f"--model-path={model_dir}/model.gguf" in args


def test_nats_init_job_runs_fleet_nats_init_from_the_one_image():
    (job,) = of_kind(load_docs(K8S), "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["fleet", "nats", "init"]
    # The NATS user as files (fleet_pipelines.settings reads NAME_FILE).
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    mounts = {volumes[m["name"]]["secret"]["secretName"]: m["mountPath"] for m in container["volumeMounts"]}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NATS_PASSWORD_FILE"] == f"{mounts['fleet-nats']}/NATS_PASSWORD"


def test_every_yaml_file_of_deploy_has_no_key_twice():
    """Kubernetes and kustomize refuse a key given twice; PyYAML would keep the last silently."""
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate keys"):
        load_all("data:\n  A: '1'\n  A: '2'\n")
    files = sorted((ROOT / "deploy").rglob("*.yaml"))
    assert len(files) >= 10
    for path in files:
        load_all(path.read_text())


def test_the_engine_capacity_the_admission_queue_uses_is_the_vllm_deployments():
    """Turns go to FLEET_LLM_BASE_URL (the fleet-vllm Service) only while the engine has a free
    slot: FLEET_ENGINE_SLOTS must be what the Deployment serves, replicas x --max-num-seqs (an
    unset value falls back to 4). The run queue lets in slots // council size deliberations."""
    (config,) = [d for d in of_kind(load_docs(K8S), "ConfigMap") if d["metadata"]["name"] == "fleet-config"]
    (vllm,) = [d for d in of_kind(load_docs(K8S), "Deployment") if d["metadata"]["name"] == "fleet-vllm"]
    args = vllm["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--max-num-seqs=$(FLEET_VLLM_MAX_NUM_SEQS)" in args
    assert "--enable-prefix-caching" in args  # reviews read their proposal's prefix from the cache
    max_num_seqs = int(config["data"]["FLEET_VLLM_MAX_NUM_SEQS"])
    slots = int(config["data"]["FLEET_ENGINE_SLOTS"])
    assert slots == vllm["spec"]["replicas"] * max_num_seqs
    # the runs that hold the engine's slots, plus one in reserve (dispatch/admission.py)
    per_engine = max(1, math.floor(slots / Task.model_fields["num_agents"].default)) + 1
    queued = VALUES["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    for limits in (
        queued["tagConcurrencyLimits"],
        INSTANCE["run_coordinator"]["config"]["tag_concurrency_limits"],
    ):
        (engine,) = [limit for limit in limits if limit["key"] == "fleet/engine"]
        assert engine["limit"] == per_engine and engine["value"] == {"applyLimitPerUniqueValue": True}
