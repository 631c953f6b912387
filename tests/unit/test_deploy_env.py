"""Every environment variable a component reads in production is set on each route it runs on:
the Helm route (the user-code deployment and the run pods the chart's K8sRunLauncher starts),
the plain manifests (deploy/k8s: Ray workers, the model init containers, the NATS init Job;
deploy/dagster: Dagster without the chart, including what its instance file reads). Values come
from the ConfigMaps in the manifests and the Secrets deploy/README.md tells operators to create."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fleet_pipelines.settings import SECRET_FILE_VARIABLES

from .deploy_objects import (
    DAGSTER_DIR,
    INSTANCE,
    K8S,
    ROOT,
    VALUES,
    chart_run_job,
    containers,
    documented_secrets,
    instance_run_job,
    load_docs,
    of_kind,
    workload_pods,
)

SOURCE = "\n".join(p.read_text() for p in (ROOT / "fleet_pipelines").rglob("*.py"))
# Read by botocore (through s3fs and dagster-aws) for s3:// storage, the model source and compute
# logs, not by our code: the credentials as a file (the fleet-s3 Secret, mounted), the region.
S3 = {"AWS_SHARED_CREDENTIALS_FILE", "AWS_REGION"}
# Variables that name a file a Secret provides: (Secret, key).
SECRET_FILES = {
    "AWS_SHARED_CREDENTIALS_FILE": ("fleet-s3", "credentials"),
    "RAY_AUTH_TOKEN_PATH": ("fleet-ray-token", "auth_token"),
    # NAME_FILE: the file NAME is read from (fleet_pipelines.settings.read_secret_files).
    "FLEET_LLM_API_KEY_FILE": ("fleet-llm", "FLEET_LLM_API_KEY"),
    "NATS_USER_FILE": ("fleet-nats", "NATS_USER"),
    "NATS_PASSWORD_FILE": ("fleet-nats", "NATS_PASSWORD"),
    "FLEET_GIT_TOKEN_FILE": ("fleet-git", "FLEET_GIT_TOKEN"),
    "FLEET_PUSH_REMOTE_FILE": ("fleet-git", "FLEET_PUSH_REMOTE"),
}
# What each component reads without a usable default in a cluster.
DAGSTER_CODE = {
    "FLEET_ENGINE_BACKEND",
    "FLEET_LLM_BASE_URL",
    "FLEET_LLM_MODEL",
    "FLEET_LLM_API_KEY",
    "FLEET_STORAGE_PATH",
    "RAY_ADDRESS",
    "NATS_URL",
    "NATS_USER",
    "NATS_PASSWORD",
    "FLEET_NATS_REPLICAS",
    "FLEET_ENGINE_SLOTS",
    "FLEET_PLANNING_START",
    "FLEET_EVAL_SCHEDULE",
    "DAGSTER_HOME",
    "RAY_AUTH_TOKEN_PATH",
    # Ray 2.60 sends the token file only in this mode (a plain `ray.init()` in the pod too).
    "RAY_AUTH_MODE",
    *S3,
}
RUN_POD = DAGSTER_CODE | {"FLEET_GIT_TOKEN", "FLEET_PUSH_REMOTE"}
# Not FLEET_LLM_API_KEY: the engine's key reaches the turns on a worker inside their EngineSettings,
# a value the dispatching run pod or code server sends (test_ray_workers_get_the_key_with_the_turns).
RAY_WORKER = {"FLEET_LLM_BASE_URL", "FLEET_LLM_MODEL"}
RAY_GPU_WORKER = RAY_WORKER | {"FLEET_VLLM_MODEL", "FLEET_VLLM_NUM_GPUS", "FLEET_VLLM_MAX_NUM_SEQS"}
MODEL_PULL = {"FLEET_MODEL_SOURCE", "FLEET_VLLM_MODEL", *S3}
NATS_INIT = {"NATS_URL", "NATS_USER", "NATS_PASSWORD", "FLEET_NATS_REPLICAS"}
IMAGE_ENV = set(
    re.findall(r"^\s+([A-Z_]+)=", (ROOT / "deploy" / "Dockerfile").read_text(), flags=re.MULTILINE)
)


def instance_env_refs(value: Any) -> set[str]:
    """Names the instance file reads through `env:` entries."""
    if isinstance(value, dict):
        return (
            {value["env"]} if set(value) == {"env"} else set().union(*map(instance_env_refs, value.values()))
        )
    if isinstance(value, list):
        return set().union(*map(instance_env_refs, value)) if value else set()
    return set()


def configmaps() -> dict[str, set[str]]:
    docs = load_docs(K8S) + load_docs(DAGSTER_DIR)
    return {d["metadata"]["name"]: set(d["data"]) for d in of_kind(docs, "ConfigMap")}


def from_sources(config_maps: list[str], secrets: list[str]) -> set[str]:
    cms, sec = configmaps(), documented_secrets()
    return IMAGE_ENV | set().union(*(cms[n] for n in config_maps)) | set().union(*(sec[n] for n in secrets))


def with_files(names: set[str]) -> set[str]:
    """The names set, NAME counted as set where NAME_FILE is (the settings read the file)."""
    return names | {
        n.removesuffix("_FILE") for n in names if n.removesuffix("_FILE") in SECRET_FILE_VARIABLES
    }


def container_env(container: dict[str, Any]) -> set[str]:
    names = with_files({e["name"] for e in container.get("env", [])})
    cms = [s["configMapRef"]["name"] for s in container.get("envFrom", []) if "configMapRef" in s]
    secrets = [s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s]
    return names | from_sources(cms, secrets)


def plain_containers() -> dict[str, dict[str, Any]]:
    found = {}
    for directory in (K8S, DAGSTER_DIR):
        for owner, pod in workload_pods(load_docs(directory)):
            for container in containers(pod):
                found[f"{owner}/{container['name']}"] = container
    return found


def routes() -> list[tuple[str, set[str], set[str]]]:
    """(where, names set there, names needed there)."""
    user = VALUES["dagster-user-deployments"]["deployments"][0]
    user_env = from_sources(
        [r["name"] for r in user["envConfigMaps"]], [r["name"] for r in user.get("envSecrets", [])]
    ) | with_files({e["name"] for e in user.get("env", [])})
    chart_run_env = container_env(chart_run_job(VALUES)["spec"]["template"]["spec"]["containers"][0])
    plain_run_env = container_env(instance_run_job()["spec"]["template"]["spec"]["containers"][0])
    instance_reads = instance_env_refs(INSTANCE)
    plain = plain_containers()
    return [
        ("helm: user-code deployment", user_env, DAGSTER_CODE),
        ("helm: run pod", chart_run_env, RUN_POD),
        (
            "plain: user-code deployment",
            container_env(plain["Deployment/fleet-pipelines/fleet-pipelines"]),
            DAGSTER_CODE,
        ),
        (
            "plain: run pod (postgres_password_secret sets DAGSTER_PG_PASSWORD)",
            plain_run_env,
            RUN_POD | instance_reads,
        ),
        (
            "plain: webserver",
            container_env(plain["Deployment/dagster-webserver/dagster-webserver"]),
            instance_reads | S3,
        ),
        (
            "plain: daemon",
            container_env(plain["Deployment/dagster-daemon/dagster-daemon"]),
            instance_reads | S3,
        ),
        ("plain: ray cpu worker", container_env(plain["RayCluster/cpu/ray-worker"]), RAY_WORKER),
        ("plain: ray gpu worker", container_env(plain["RayCluster/gpu/ray-worker"]), RAY_GPU_WORKER),
        ("plain: vllm model-pull", container_env(plain["Deployment/fleet-vllm/model-pull"]), MODEL_PULL),
        ("plain: ray gpu model-pull", container_env(plain["RayCluster/gpu/model-pull"]), MODEL_PULL),
        ("plain: nats init job", container_env(plain["Job/fleet-nats-init/nats-init"]), NATS_INIT),
    ]


def test_the_names_needed_are_the_names_the_code_reads():
    for name in RUN_POD | RAY_GPU_WORKER | MODEL_PULL | NATS_INIT:
        assert name in S3 or f'"{name}"' in SOURCE, f"{name}: no code reads it"
    assert instance_env_refs(INSTANCE) == {
        "DAGSTER_PG_HOST",
        "DAGSTER_PG_USER",
        "DAGSTER_PG_PASSWORD",
        "DAGSTER_PG_DB",
    }


@pytest.mark.parametrize(("where", "present", "needed"), routes(), ids=[r[0] for r in routes()])
def test_every_name_a_component_reads_is_set_on_its_route(where: str, present: set[str], needed: set[str]):
    assert needed - present == set()


def secret_refs(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Secret name -> how the container gets it ("env" or the mount path of its volume)."""
    refs = {s["secretRef"]["name"]: "env" for s in container.get("envFrom", []) if "secretRef" in s}
    for env in container.get("env", []):
        if ref := env.get("valueFrom", {}).get("secretKeyRef"):
            refs[ref["name"]] = "env"
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        if secret := volumes[mount["name"]].get("secret"):
            refs[secret["secretName"]] = mount["mountPath"]
    return refs


def every_container() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    pods = [*workload_pods(load_docs(K8S)), *workload_pods(load_docs(DAGSTER_DIR))]
    pods += [("helm/run", chart_run_job(VALUES)["spec"]["template"]["spec"])]
    pods += [("plain/run", instance_run_job()["spec"]["template"]["spec"])]
    return [(f"{owner}/{c['name']}", pod, c) for owner, pod in pods for c in containers(pod)]


@pytest.mark.parametrize(
    ("where", "pod", "container"), every_container(), ids=[w for w, _, _ in every_container()]
)
def test_a_secret_file_is_mounted_where_its_variable_points(
    where: str, pod: dict[str, Any], container: dict[str, Any]
):
    """A variable naming a Secret's file has that Secret mounted there; a Secret mounted as files
    is named by such a variable (no Secret is mounted where nothing reads it)."""
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    refs = secret_refs(pod, container)
    documented = documented_secrets()
    for variable, (secret, key) in SECRET_FILES.items():
        if variable in env:
            directory, _, name = env[variable].rpartition("/")
            assert refs.get(secret) == directory and name == key and key in documented[secret], where
    mounted = {secret for secret, how in refs.items() if how != "env"}
    named = {SECRET_FILES[v][0] for v in env if v in SECRET_FILES}
    assert mounted == named, where


PROPOSAL_CODE_PODS = {
    "plain/run/dagster",
    "helm/run/dagster",
    "RayCluster/cpu/ray-worker",
    "RayCluster/gpu/ray-worker",
}


@pytest.mark.parametrize("where", sorted(PROPOSAL_CODE_PODS))
def test_pods_that_run_proposal_code_hold_only_the_secrets_they_use(where: str):
    """Run pods and Ray workers run proposal code (in the sandbox): each Secret they hold is one
    whose keys their own code reads (or the file Ray reads for its token)."""
    ((pod, container),) = [(p, c) for w, p, c in every_container() if w == where]
    needed = RUN_POD | instance_env_refs(INSTANCE) if "run" in where else RAY_GPU_WORKER | {"RAY_AUTH_TOKEN"}
    documented = documented_secrets() | {"dagster-postgresql-secret": {"DAGSTER_PG_PASSWORD"}}
    documented["fleet-ray-token"] = {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"}
    documented["fleet-s3"] = {"AWS_SHARED_CREDENTIALS_FILE"}
    for secret in secret_refs(pod, container):
        assert documented[secret] & needed, (where, secret)
    assert "fleet-git" not in secret_refs(pod, container) or "run" in where


def test_the_cpu_engine_reads_its_key_from_the_file_its_manifest_mounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """engine/cpu runs `fleet model serve` with FLEET_LLM_API_KEY_FILE pointing into the mounted
    fleet-llm Secret (no variable holds the key), and the command serves with that key."""
    from click.testing import CliRunner

    import fleet_pipelines.llm.local_server as local_server
    from fleet_pipelines.cli.model import model

    ((pod, container),) = [
        (p, c)
        for _, p in workload_pods(load_docs(K8S / "engine" / "cpu"))
        for c in containers(p)
        if c["name"] == "llamacpp"
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert secret_refs(pod, container) == {"fleet-llm": "/var/run/secrets/fleet/llm"}
    assert env["FLEET_LLM_API_KEY_FILE"] == "/var/run/secrets/fleet/llm/FLEET_LLM_API_KEY"
    (tmp_path / "FLEET_LLM_API_KEY").write_text("k-2\n")
    served: list[Any] = []
    monkeypatch.setattr(local_server, "serve", lambda settings: served.append(settings))
    monkeypatch.setenv("FLEET_LLM_API_KEY", "")  # unset for the command, restored after
    monkeypatch.setenv("FLEET_LLM_API_KEY_FILE", str(tmp_path / "FLEET_LLM_API_KEY"))
    done = CliRunner().invoke(model, ["serve", "--model-path", str(tmp_path / "model.gguf")])
    assert done.exit_code == 0, done.output
    assert served[0].api_key == "k-2"
