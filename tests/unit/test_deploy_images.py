"""Every image deploy/ applies is pinned by digest, or waits for the release step that pins it.

deploy/images.yaml lists every image reference applied (manifests, the chart values we set, the
kind cluster) with its digest; deploy/pin-images.py resolves the missing ones from the registry
(`resolve`) and writes them into every reference (`apply`), and `check` fails while any applied
reference is tag-only. No registry is reachable here, so our own images (built at release) and
the third-party images whose digest could not be read from a source here stay tag-only in the
repository: these tests make that set explicit (a new tag-only image fails), check the script
pins them all when given digests, and check the pinned ones against the lock."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .deploy_objects import (
    DAGSTER_DIR,
    DEPLOY,
    K8S,
    NATS_CHART_IMAGES,
    NATS_VALUES,
    NODE_DIR,
    containers,
    load_docs,
    nats_image,
    nats_pods,
    workload_pods,
)

spec = importlib.util.spec_from_file_location("pin_images", DEPLOY / "pin-images.py")
assert spec and spec.loader
pin_images = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pin_images)

LOCK = {i["ref"]: i["digest"] for i in yaml.safe_load((DEPLOY / "images.yaml").read_text())["images"]}
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def split(reference: str) -> tuple[str, str]:
    ref, _, digest = reference.partition("@")
    return ref, digest


def applied_references() -> list[tuple[str, str]]:
    """(file, reference) of every image reference in deploy/, as pin-images.py reads them."""
    return [
        (str(path.relative_to(DEPLOY)), ref)
        for path in pin_images.files()
        for ref in pin_images.references(path.read_text())
    ]


def test_the_reader_finds_every_container_image_of_the_manifests():
    """What pin-images.py reads covers every container image of what the kustomizations apply."""
    read = {split(ref)[0] for _, ref in applied_references()}
    for directory in (K8S, K8S / "engine" / "cpu", DAGSTER_DIR, NODE_DIR):
        for owner, pod in workload_pods(load_docs(directory)):
            for container in containers(pod):
                if container["name"] in ("wait-gcs-ready", "autoscaler"):
                    continue  # added by KubeRay with the Ray container's image
                assert split(container["image"])[0] in read, owner


def qualified(reference: str) -> str:
    """A Docker Hub short name as the container runtimes resolve it (docker.io, library/)."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return reference
    return f"docker.io/{reference}" if rest else f"docker.io/library/{reference}"


def test_every_image_the_nats_chart_can_deploy_is_named_and_locked():
    """The NATS chart's images (its defaults at 2.14.2, NATS_CHART_IMAGES) are each named in
    helm/nats-values.yaml as the same image, so pin-images.py reads, locks and pins them: the
    server and reloader it deploys here, and the exporter and nats-box, which are off."""
    read = {split(ref)[0] for path, ref in applied_references() if path == "helm/nats-values.yaml"}
    for path, default in NATS_CHART_IMAGES.items():
        rendered = nats_image(NATS_VALUES, path)
        assert rendered == qualified(f"{default['repository']}:{default['tag']}"), path
        assert rendered in read and rendered in LOCK, path
    with_all = {**NATS_VALUES, "natsBox": {**NATS_VALUES["natsBox"], "enabled": True}}
    images = {c["image"] for _, pod in nats_pods(with_all) for c in containers(pod)}
    assert images == {
        "docker.io/library/nats:2.14.2-alpine",
        "docker.io/natsio/nats-server-config-reloader:0.23.0",
        "docker.io/natsio/nats-box:0.19.7",
    }


def test_every_applied_image_is_in_the_lock_and_carries_its_digest():
    for path, reference in applied_references():
        ref, digest = split(reference)
        assert ref in LOCK, (path, reference)
        assert digest in ("", LOCK[ref]), (path, reference)
        if LOCK[ref]:
            assert digest == LOCK[ref], f"{path}: {ref} is locked to {LOCK[ref]} but applied without it"
    assert {split(r)[0] for _, r in applied_references()} == set(LOCK)
    assert all(DIGEST.match(d) for d in LOCK.values() if d)


def test_the_tag_only_images_are_exactly_those_the_release_step_resolves():
    """Ours (built at release) and the third-party tags whose digest no source here gave."""
    tag_only = {split(r)[0] for _, r in applied_references() if not split(r)[1]}
    assert tag_only == {ref for ref, digest in LOCK.items() if not digest}
    assert tag_only == {
        "registry.example.com/fleet-pipelines:0.1.0",
        "registry.example.com/fleet-pipelines:0.1.0-gpu",
        "docker.io/library/busybox:1.37.0",
        "docker.io/library/postgres:17-alpine",
        "docker.io/library/python:3.11-slim-bookworm",
        "quay.io/kuberay/operator:v1.7.0",
        "docker.io/library/nats:2.14.2-alpine",
        "docker.io/natsio/nats-server-config-reloader:0.23.0",
        "docker.io/natsio/prometheus-nats-exporter:0.20.1",
        "docker.io/natsio/nats-box:0.19.7",
    }
    assert (
        subprocess.run(
            [sys.executable, str(DEPLOY / "pin-images.py"), "check"], capture_output=True
        ).returncode
        == 1
    )


def test_the_release_step_pins_every_reference(tmp_path: Path):
    """On a copy of deploy/ with a digest for each image: `apply` writes them everywhere, `check`
    passes, and what kubectl's kustomize renders names every image by digest (the run image of
    the admission policy and DAGSTER_CURRENT_IMAGE too), but our own in the kind overlay, which
    `kind load` gives the nodes by tag only: there every mention of it keeps the tag alone."""
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    lock = copy / "images.yaml"
    text = lock.read_text()
    for n, ref in enumerate(LOCK):
        if not LOCK[ref]:
            text = text.replace(f'ref: "{ref}", digest: ""', f'ref: "{ref}", digest: "sha256:{n:064x}"')
    lock.write_text(text)
    script = copy / "pin-images.py"
    subprocess.run([sys.executable, str(script), "apply"], check=True)
    subprocess.run([sys.executable, str(script), "apply"], check=True)  # idempotent
    done = subprocess.run([sys.executable, str(script), "check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    values = yaml.safe_load((copy / "helm" / "dagster-values.yaml").read_text())
    assert "@sha256:" in values["dagsterDaemon"]["image"]["tag"]
    nats = yaml.safe_load((copy / "helm" / "nats-values.yaml").read_text())
    for path in NATS_CHART_IMAGES:
        assert re.search(r":[\w.-]+@sha256:[0-9a-f]{64}$", nats_image(nats, path)), path
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    assert re.search(
        r"^ARG BASE_IMAGE=\S+@sha256:[0-9a-f]{64}$", (copy / "Dockerfile").read_text(), re.MULTILINE
    )
    ours = "registry.example.com/fleet-pipelines"
    for route in ("k8s", "dagster", "node", "kind"):
        rendered = subprocess.run(
            [kubectl, "kustomize", str(copy / route)], capture_output=True, text=True, check=True
        ).stdout
        images = re.findall(r"image: (\S+)", rendered)
        mentions = re.findall(rf"{ours}:[\w.@:-]+", rendered)
        if route == "kind":
            assert mentions and all(m == f"{ours}:0.1.0" for m in mentions), mentions
            images = [i for i in images if not i.startswith(ours)]
        else:
            assert all("@sha256:" in m for m in mentions), (route, mentions)
        assert images and all(re.search(r"@sha256:[0-9a-f]{64}$", i) for i in images), (route, images)
