"""Every pod of deploy/ that reaches an API server is admitted by Kubernetes Pod Security at the
level its namespace enforces: the plain manifests of both routes, the pods the Dagster and NATS
charts render from our values, the KubeRay operator's head and worker pods with the containers it
injects, and the run Job that dagster-k8s's own code builds from our run-launcher settings.

Pod Security admission is Go (k8s.io/pod-security-admission) and cannot run here, so its checks
are written below, one function per upstream check, named by the check's ID and its versions as in
`policy/check_*.go` of github.com/kubernetes/pod-security-admission at tag v0.35.6 (the admission
plugin of Kubernetes 1.35), and evaluated as its `policy/registry.go` does: a level's checks at the
newest revision not newer than the policy version, baseline checks included in restricted unless a
restricted check overrides them. They are tested against upstream's own pass and fail cases for
policy versions v1.33-v1.35 (tests/unit/schemas/pod-security-cases.yaml, copied unchanged from
upstream's test/testdata). Our namespace pins enforce-version v1.35; API servers 1.33 and 1.34
apply their latest (v1.33, v1.34) instead, so our pods are checked at all three.

The scoring pods (Dagster run pods, Ray workers) also give the sandbox what bubblewrap needs:
a non-root uid, a user namespace of their own, and the Localhost seccomp and AppArmor profiles
shipped in deploy/node/, on nodes that have them. Their /proc stays masked (restricted allows
nothing else): the sandbox then runs with no /proc (deploy/README.md, "The sandbox")."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from .deploy_objects import (
    DAGSTER_DIR,
    FAST_LOADER,
    K8S,
    NATS_VALUES,
    NODE_DIR,
    ROOT,
    VALUES,
    Pod,
    chart_pods,
    containers,
    instance_run_job,
    load_docs,
    nats_pods,
    workload_pods,
)

# --- Pod Security admission, policy/check_*.go at v0.35.6 ------------------------------------------

Meta = dict[str, Any]  # the pod's metadata (annotations)
CheckFn = Callable[[Meta, Pod], str | None]  # None: allowed; else the forbidden reason
Version = tuple[int, int]
CASES = yaml.load(
    (Path(__file__).parent / "schemas" / "pod-security-cases.yaml").read_text(), Loader=FAST_LOADER
)
POLICY_VERSIONS: list[Version] = [(1, 33), (1, 34), (1, 35)]  # what API servers 1.33+ apply to our label


def visit(pod: Pod) -> Iterator[dict[str, Any]]:
    """policy/visitor.go visitContainers: init, regular and ephemeral containers."""
    yield from pod.get("initContainers") or []
    yield from pod.get("containers") or []
    yield from pod.get("ephemeralContainers") or []


def sc(container_or_pod: dict[str, Any]) -> dict[str, Any]:
    return container_or_pod.get("securityContext") or {}


def user_namespaced(pod: Pod) -> bool:
    """policy/helpers.go relaxPolicyForUserNamespacePod: hostUsers set to false."""
    return pod.get("hostUsers") is False


def not_windows(check: CheckFn) -> CheckFn:
    """The 1.25 revisions of several restricted checks: a Windows pod (spec.os.name) is allowed."""
    return lambda meta, pod: None if (pod.get("os") or {}).get("name") == "windows" else check(meta, pod)


def bad(containers_: list[str], reason: str) -> str | None:
    return f"{reason}: {', '.join(containers_)}" if containers_ else None


def host_namespaces_1_0(meta: Meta, pod: Pod) -> str | None:
    found = [f"{f}=true" for f in ("hostNetwork", "hostPID", "hostIPC") if pod.get(f)]
    return bad(found, "host namespaces")


def privileged_1_0(meta: Meta, pod: Pod) -> str | None:
    return bad([c["name"] for c in visit(pod) if sc(c).get("privileged") is True], "privileged")


CAPABILITIES_ALLOWED_1_0 = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def capabilities_baseline_1_0(meta: Meta, pod: Pod) -> str | None:
    found = [
        c["name"]
        for c in visit(pod)
        if set((sc(c).get("capabilities") or {}).get("add") or []) - CAPABILITIES_ALLOWED_1_0
    ]
    return bad(found, "non-default capabilities")


def host_path_volumes_1_0(meta: Meta, pod: Pod) -> str | None:
    return bad(
        [v["name"] for v in pod.get("volumes") or [] if v.get("hostPath") is not None], "hostPath volumes"
    )


def host_ports_1_0(meta: Meta, pod: Pod) -> str | None:
    found = [c["name"] for c in visit(pod) if any(p.get("hostPort") for p in c.get("ports") or [])]
    return bad(found, "hostPort")


def app_armor_profile_1_0(meta: Meta, pod: Pod) -> str | None:
    allowed = {"RuntimeDefault", "Localhost"}
    found = []
    if "appArmorProfile" in sc(pod) and sc(pod)["appArmorProfile"].get("type") not in allowed:
        found.append("pod")
    found += [
        c["name"]
        for c in visit(pod)
        if "appArmorProfile" in sc(c) and sc(c)["appArmorProfile"].get("type") not in allowed
    ]
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value in ("", "runtime/default") or value.startswith("localhost/")
        ):
            found.append(f"annotation {key}")
    return bad(found, "forbidden AppArmor profile")


def se_linux_options(allowed_types: set[str]) -> CheckFn:
    def check(meta: Meta, pod: Pod) -> str | None:
        def invalid(options: dict[str, Any] | None) -> bool:
            return options is not None and (
                options.get("type", "") not in allowed_types
                or bool(options.get("user"))
                or bool(options.get("role"))
            )

        found = ["pod"] if invalid(sc(pod).get("seLinuxOptions")) else []
        found += [c["name"] for c in visit(pod) if invalid(sc(c).get("seLinuxOptions"))]
        return bad(found, "seLinuxOptions")

    return check


SELINUX_TYPES_1_0 = {"", "container_t", "container_init_t", "container_kvm_t"}


def proc_mount_1_0(meta: Meta, pod: Pod) -> str | None:
    found = [
        f"{c['name']} ({sc(c)['procMount']})"
        for c in visit(pod)
        if sc(c).get("procMount") is not None and sc(c)["procMount"] != "Default"
    ]
    return bad(found, "procMount")


def proc_mount_1_35_baseline(meta: Meta, pod: Pod) -> str | None:
    return None if user_namespaced(pod) else proc_mount_1_0(meta, pod)


def valid_seccomp(profile: dict[str, Any]) -> bool:
    return profile.get("type") in ("RuntimeDefault", "Localhost")


def seccomp_profile_baseline_1_0(meta: Meta, pod: Pod) -> str | None:
    """Before 1.19: the seccomp annotations of the pod and of each of its containers."""
    annotations = meta.get("annotations") or {}
    keys = ["seccomp.security.alpha.kubernetes.io/pod"]
    keys += [f"container.seccomp.security.alpha.kubernetes.io/{c['name']}" for c in visit(pod)]
    found = [
        key
        for key in keys
        if key in annotations
        and not (
            annotations[key] in ("runtime/default", "docker/default")
            or annotations[key].startswith("localhost/")
        )
    ]
    return bad(found, "seccompProfile")


def seccomp_profile_baseline_1_19(meta: Meta, pod: Pod) -> str | None:
    found = ["pod"] if "seccompProfile" in sc(pod) and not valid_seccomp(sc(pod)["seccompProfile"]) else []
    found += [
        c["name"]
        for c in visit(pod)
        if "seccompProfile" in sc(c) and not valid_seccomp(sc(c)["seccompProfile"])
    ]
    return bad(found, "seccompProfile")


SYSCTLS_1_0 = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
}  # fmt: skip
SYSCTLS_1_27 = SYSCTLS_1_0 | {"net.ipv4.ip_local_reserved_ports"}
SYSCTLS_1_29 = SYSCTLS_1_27 | {
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SYSCTLS_1_32 = SYSCTLS_1_29 | {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}


def sysctls(allowed: set[str]) -> CheckFn:
    return lambda meta, pod: bad(
        [s["name"] for s in sc(pod).get("sysctls") or [] if s["name"] not in allowed], "forbidden sysctls"
    )


def windows_host_process_1_0(meta: Meta, pod: Pod) -> str | None:
    def host_process(context: dict[str, Any]) -> bool:
        return (context.get("windowsOptions") or {}).get("hostProcess") is True

    found = ["pod"] if host_process(sc(pod)) else []
    found += [c["name"] for c in visit(pod) if host_process(sc(c))]
    return bad(found, "hostProcess")


def host_probes_and_host_lifecycle_1_34(meta: Meta, pod: Pod) -> str | None:
    def hosts(handler: dict[str, Any] | None) -> list[str]:
        handler = handler or {}
        return [
            h
            for h in (
                (handler.get("httpGet") or {}).get("host"),
                (handler.get("tcpSocket") or {}).get("host"),
            )
            if h
        ]

    found = []
    for c in visit(pod):
        lifecycle = c.get("lifecycle") or {}
        handlers = [c.get("livenessProbe"), c.get("readinessProbe"), c.get("startupProbe")]
        handlers += [lifecycle.get("postStart"), lifecycle.get("preStop")]
        if any(hosts(h) for h in handlers):
            found.append(c["name"])
    return bad(found, "probe or lifecycle host")


RESTRICTED_VOLUME_SOURCES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def restricted_volumes_1_0(meta: Meta, pod: Pod) -> str | None:
    """A volume with no source at all is an emptyDir: the API server defaults it before admission
    (SetDefaults_Volume; upstream's pass case restrictedvolumes0 has one)."""
    found = [
        v["name"]
        for v in pod.get("volumes") or []
        if set(v) - {"name"} and not any(v.get(source) is not None for source in RESTRICTED_VOLUME_SOURCES)
    ]
    return bad(found, "restricted volume types")


def allow_privilege_escalation_1_8(meta: Meta, pod: Pod) -> str | None:
    return bad(
        [c["name"] for c in visit(pod) if sc(c).get("allowPrivilegeEscalation") is not False],
        "allowPrivilegeEscalation != false",
    )


def run_as_non_root_1_0(meta: Meta, pod: Pod) -> str | None:
    pod_value = sc(pod).get("runAsNonRoot")
    found = ["pod"] if pod_value is False else []
    for c in visit(pod):
        value = sc(c).get("runAsNonRoot")
        if value is False or (value is None and pod_value is not True):
            found.append(c["name"])
    return bad(found, "runAsNonRoot != true")


def run_as_non_root_1_35(meta: Meta, pod: Pod) -> str | None:
    return None if user_namespaced(pod) else run_as_non_root_1_0(meta, pod)


def run_as_user_1_23(meta: Meta, pod: Pod) -> str | None:
    found = ["pod"] if sc(pod).get("runAsUser") == 0 else []
    found += [c["name"] for c in visit(pod) if sc(c).get("runAsUser") == 0]
    return bad(found, "runAsUser=0")


def run_as_user_1_35(meta: Meta, pod: Pod) -> str | None:
    return None if user_namespaced(pod) else run_as_user_1_23(meta, pod)


def seccomp_profile_restricted_1_19(meta: Meta, pod: Pod) -> str | None:
    pod_profile = sc(pod).get("seccompProfile")
    if pod_profile is not None and not valid_seccomp(pod_profile):
        return "seccompProfile: pod"
    found = []
    for c in visit(pod):
        profile = sc(c).get("seccompProfile")
        if (profile is not None and not valid_seccomp(profile)) or (profile is None and pod_profile is None):
            found.append(c["name"])
    return bad(found, "seccompProfile")


def capabilities_restricted_1_22(meta: Meta, pod: Pod) -> str | None:
    found = []
    for c in visit(pod):
        caps = sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(c["name"])
    return bad(found, "unrestricted capabilities")


@dataclass(frozen=True)
class Revision:
    minimum: Version
    check: CheckFn
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    id: str  # upstream's CheckID
    level: str  # baseline | restricted
    revisions: tuple[Revision, ...]


CHECKS = (
    # Baseline
    Check("appArmorProfile", "baseline", (Revision((1, 0), app_armor_profile_1_0),)),
    Check("capabilities_baseline", "baseline", (Revision((1, 0), capabilities_baseline_1_0),)),
    Check("hostNamespaces", "baseline", (Revision((1, 0), host_namespaces_1_0),)),
    Check("hostPathVolumes", "baseline", (Revision((1, 0), host_path_volumes_1_0),)),
    Check("hostPorts", "baseline", (Revision((1, 0), host_ports_1_0),)),
    Check("hostProbesAndHostLifecycle", "baseline", (
        Revision((1, 34), host_probes_and_host_lifecycle_1_34),
    )),
    Check("privileged", "baseline", (Revision((1, 0), privileged_1_0),)),
    Check("procMount", "baseline", (
        Revision((1, 0), proc_mount_1_0),
        Revision((1, 35), proc_mount_1_35_baseline),
    )),
    Check("seLinuxOptions", "baseline", (
        Revision((1, 0), se_linux_options(SELINUX_TYPES_1_0)),
        Revision((1, 31), se_linux_options(SELINUX_TYPES_1_0 | {"container_engine_t"})),
    )),
    Check("seccompProfile_baseline", "baseline", (
        Revision((1, 0), seccomp_profile_baseline_1_0),
        Revision((1, 19), seccomp_profile_baseline_1_19),
    )),
    Check("sysctls", "baseline", (
        Revision((1, 0), sysctls(SYSCTLS_1_0)),
        Revision((1, 27), sysctls(SYSCTLS_1_27)),
        Revision((1, 29), sysctls(SYSCTLS_1_29)),
        Revision((1, 32), sysctls(SYSCTLS_1_32)),
    )),
    Check("windowsHostProcess", "baseline", (Revision((1, 0), windows_host_process_1_0),)),
    # Restricted
    Check("allowPrivilegeEscalation", "restricted", (
        Revision((1, 8), allow_privilege_escalation_1_8),
        Revision((1, 25), not_windows(allow_privilege_escalation_1_8)),
    )),
    Check("capabilities_restricted", "restricted", (
        Revision((1, 22), capabilities_restricted_1_22, ("capabilities_baseline",)),
        Revision((1, 25), not_windows(capabilities_restricted_1_22), ("capabilities_baseline",)),
    )),
    Check("procMount_restricted", "restricted", (Revision((1, 35), proc_mount_1_0, ("procMount",)),)),
    Check("restrictedVolumes", "restricted", (
        Revision((1, 0), restricted_volumes_1_0, ("hostPathVolumes",)),
    )),
    Check("runAsNonRoot", "restricted", (
        Revision((1, 0), run_as_non_root_1_0),
        Revision((1, 35), run_as_non_root_1_35),
    )),
    Check("runAsUser", "restricted", (
        Revision((1, 23), run_as_user_1_23),
        Revision((1, 35), run_as_user_1_35),
    )),
    Check("seccompProfile_restricted", "restricted", (
        Revision((1, 19), seccomp_profile_restricted_1_19, ("seccompProfile_baseline",)),
        Revision((1, 25), not_windows(seccomp_profile_restricted_1_19), ("seccompProfile_baseline",)),
    )),
)  # fmt: skip


def active_checks(level: str, version: Version) -> dict[str, CheckFn]:
    """policy/registry.go: per check, its newest revision at or below `version`; at restricted, the
    baseline checks too, less those a restricted revision overrides; privileged: none."""
    if level == "privileged":
        return {}
    chosen: dict[str, Revision] = {}
    levels = ("baseline",) if level == "baseline" else ("baseline", "restricted")
    for check in CHECKS:
        revisions = [r for r in check.revisions if r.minimum <= version]
        if check.level in levels and revisions:
            chosen[check.id] = revisions[-1]
    overridden = {
        o for c in CHECKS if c.level == "restricted" and c.id in chosen for o in chosen[c.id].overrides
    }
    return {cid: r.check for cid, r in chosen.items() if cid not in overridden}


def violations(pod: Pod, level: str, version: Version, meta: Meta | None = None) -> dict[str, str]:
    """Check ID -> forbidden reason, for every check of the level that refuses the pod."""
    results = {cid: check(meta or {}, pod) for cid, check in active_checks(level, version).items()}
    return {cid: reason for cid, reason in results.items() if reason is not None}


def upstream_cases(expect: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    return [
        (level, version, name, pod)
        for level, by_version in CASES.items()
        for version, by_expect in by_version.items()
        for name, pod in by_expect.get(expect, {}).items()
    ]


def version_of(label: str) -> Version:
    major, minor = label.removeprefix("v").split(".")
    return int(major), int(minor)


def check_named_by(case: str, level: str, version: Version) -> str:
    """A fail case's file name starts with the lowercased ID of the check it breaks; at restricted,
    a check a restricted one overrides is reported by the overriding check."""
    stem = re.sub(r"\d+$", "", case)
    ids = {c.id.lower(): c.id for c in CHECKS}
    check_id = ids[stem]
    active = active_checks(level, version)
    if check_id in active:
        return check_id
    overriders = {
        c.id
        for c in CHECKS
        if c.id in active
        for r in c.revisions
        if check_id in r.overrides and r.minimum <= version
    }
    (overrider,) = overriders
    return overrider


@pytest.mark.parametrize(
    ("level", "version", "case", "pod"),
    upstream_cases("fail"),
    ids=[f"{lv}-{v}-{n}" for lv, v, n, _ in upstream_cases("fail")],
)
def test_the_checks_refuse_upstreams_fail_cases(level: str, version: str, case: str, pod: dict[str, Any]):
    found = violations(pod["spec"], level, version_of(version), pod.get("metadata"))
    assert check_named_by(case, level, version_of(version)) in found, found


@pytest.mark.parametrize(
    ("level", "version", "case", "pod"),
    upstream_cases("pass"),
    ids=[f"{lv}-{v}-{n}" for lv, v, n, _ in upstream_cases("pass")],
)
def test_the_checks_admit_upstreams_pass_cases(level: str, version: str, case: str, pod: dict[str, Any]):
    assert violations(pod["spec"], level, version_of(version), pod.get("metadata")) == {}


def test_upstreams_cases_cover_every_check_and_each_of_our_policy_versions():
    assert {(lv, version_of(v)) for lv, v, _, _ in upstream_cases("fail")} == {
        (lv, v) for lv in ("baseline", "restricted") for v in POLICY_VERSIONS
    }
    named = {check_named_by(n, lv, version_of(v)) for lv, v, n, _ in upstream_cases("fail") if v == "v1.35"}
    assert named == {c.id for c in CHECKS}


# --- our pods, at the level their namespace enforces -------------------------------------------------


def namespaces() -> dict[str, dict[str, str]]:
    """Namespace -> its pod-security.kubernetes.io labels, from the manifests of deploy/."""
    docs = load_docs(K8S) + load_docs(NODE_DIR)
    return {
        d["metadata"]["name"]: {
            k.removeprefix("pod-security.kubernetes.io/"): v
            for k, v in d["metadata"].get("labels", {}).items()
            if k.startswith("pod-security.kubernetes.io/")
        }
        for d in docs
        if d["kind"] == "Namespace"
    }


def every_pod() -> list[tuple[str, str, Pod]]:
    """(namespace, owner, pod spec) of every pod deploy/ makes an API server admit."""
    run = instance_run_job()
    return [
        *(("fleet", owner, pod) for owner, pod in workload_pods(load_docs(K8S))),
        *(("fleet", owner, pod) for owner, pod in workload_pods(load_docs(DAGSTER_DIR))),
        (run["metadata"]["namespace"], "dagster.yaml/run", run["spec"]["template"]["spec"]),
        *(("fleet", owner, pod) for owner, pod in chart_pods(VALUES)),
        *(("fleet", owner, pod) for owner, pod in nats_pods(NATS_VALUES)),
        *(("fleet-node", owner, pod) for owner, pod in workload_pods(load_docs(NODE_DIR))),
    ]


EVERY_POD = every_pod()


def test_every_route_has_its_pods_here():
    owners = {owner for _, owner, _ in EVERY_POD}
    assert owners >= {
        "Deployment/fleet-vllm",
        "Job/fleet-nats-init",
        "RayCluster/head",
        "RayCluster/cpu",
        "RayCluster/gpu",
        "Deployment/dagster-webserver",
        "Deployment/dagster-daemon",
        "Deployment/fleet-pipelines",
        "dagster.yaml/run",
        "chart/webserver",
        "chart/daemon",
        "chart/user-deployment/fleet-pipelines",
        "chart/run",
        "chart/nats",
        "DaemonSet/fleet-sandbox-profiles",
    }


def test_kuberay_pods_carry_the_containers_the_operator_injects():
    pods = {owner: pod for _, owner, pod in EVERY_POD}
    assert [c["name"] for c in pods["RayCluster/head"]["containers"]] == ["ray-head", "autoscaler"]
    for group in ("cpu", "gpu"):
        worker = pods[f"RayCluster/{group}"]
        assert worker["initContainers"][-1]["name"] == "wait-gcs-ready"
        # A copy of the Ray container's securityContext (pod.go DefaultWorkerPodTemplate).
        assert worker["initContainers"][-1]["securityContext"] == worker["containers"][0]["securityContext"]


@pytest.mark.parametrize("version", POLICY_VERSIONS, ids=[f"v{a}.{b}" for a, b in POLICY_VERSIONS])
@pytest.mark.parametrize(("namespace", "owner", "pod"), EVERY_POD, ids=[o for _, o, _ in EVERY_POD])
def test_pod_is_admitted_at_the_level_its_namespace_enforces(
    namespace: str, owner: str, pod: Pod, version: Version
):
    labels = namespaces()[namespace]
    assert version_of(labels["enforce-version"]) >= version  # a newer server applies the pinned one
    assert violations(pod, labels["enforce"], version) == {}


def test_namespaces_enforce_restricted_except_the_node_installers():
    """Everything of the platform runs where `restricted` is enforced (and warned and audited);
    only the profile installer, which writes to the node, runs privileged, in a namespace of its own."""
    labels = namespaces()
    assert labels["fleet"] == {
        "enforce": "restricted",
        "enforce-version": "v1.35",
        "warn": "restricted",
        "warn-version": "v1.35",
        "audit": "restricted",
        "audit-version": "v1.35",
    }
    assert labels["fleet-node"]["enforce"] == "privileged"
    assert {ns for ns, _, _ in EVERY_POD} == {"fleet", "fleet-node"}
    assert {o for ns, o, _ in EVERY_POD if ns == "fleet-node"} == {"DaemonSet/fleet-sandbox-profiles"}


SCORING_PODS = {"RayCluster/cpu", "RayCluster/gpu", "dagster.yaml/run", "chart/run"}


@pytest.mark.parametrize("owner", sorted(SCORING_PODS))
def test_putting_procmount_unmasked_back_into_a_scoring_pod_is_refused(owner: str):
    """The old setting (procMount: Unmasked, for a fresh /proc in the sandbox): `restricted` refuses
    it at every policy version, user namespace or not (procMount_restricted, v1.35); only
    `baseline` v1.35 would admit it in a user-namespaced pod."""
    (pod,) = [p for _, o, p in EVERY_POD if o == owner]
    unmasked = copy.deepcopy(pod)
    unmasked["containers"][0]["securityContext"]["procMount"] = "Unmasked"
    assert unmasked["hostUsers"] is False
    for version in POLICY_VERSIONS:
        found = violations(unmasked, "restricted", version)
        assert set(found) == {"procMount_restricted" if version >= (1, 35) else "procMount"}, found
    assert violations(unmasked, "baseline", (1, 35)) == {}
    assert set(violations(unmasked, "baseline", (1, 34))) == {"procMount"}


def test_the_checks_catch_each_way_to_run_as_root():
    _, _, pod = EVERY_POD[0]
    assert violations(pod, "restricted", (1, 35)) == {}
    breaks = {
        "runAsNonRoot": lambda p: p["securityContext"].pop("runAsNonRoot"),
        "allowPrivilegeEscalation": lambda p: p["containers"][0]["securityContext"].pop(
            "allowPrivilegeEscalation"
        ),
        "capabilities_restricted": lambda p: p["containers"][0]["securityContext"].pop("capabilities"),
        "seccompProfile_restricted": lambda p: p["securityContext"].pop("seccompProfile"),
        "privileged": lambda p: p["containers"][0]["securityContext"].update(privileged=True),
        "runAsUser": lambda p: p["containers"][0]["securityContext"].update(runAsUser=0),
        "restrictedVolumes": lambda p: p.setdefault("volumes", []).append(
            {"name": "h", "hostPath": {"path": "/"}}
        ),
        "appArmorProfile": lambda p: p["containers"][0]["securityContext"].update(
            appArmorProfile={"type": "Unconfined"}
        ),
        "hostNamespaces": lambda p: p.update(hostPID=True),
    }
    for check_id, apply in breaks.items():
        broken = copy.deepcopy(pod)
        apply(broken)
        assert check_id in violations(broken, "restricted", (1, 35)), check_id


@pytest.mark.parametrize(("namespace", "owner", "pod"), EVERY_POD, ids=[o for _, o, _ in EVERY_POD])
def test_no_container_needs_a_privileged_port(namespace: str, owner: str, pod: Pod):
    """Without capabilities a non-root process cannot bind a port below 1024."""
    for container in containers(pod):
        for port in container.get("ports", []):
            assert port["containerPort"] >= 1024, (owner, container["name"], port)


def test_pods_run_as_the_images_user():
    """The image's USER owns DAGSTER_HOME and the venv's writable paths; pods pin the same uid."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    users = set(re.findall(r"^USER (\d+):(\d+)$", dockerfile, flags=re.MULTILINE))
    assert users == {("10001", "10001")}
    for namespace, owner, pod in EVERY_POD:
        if owner.startswith("chart/nats") or namespace == "fleet-node":
            continue  # the upstream NATS image; the node installer runs as root on purpose
        uid = (pod.get("securityContext") or {}).get("runAsUser")
        assert uid == 10001, owner


NODE = NODE_DIR
PROFILES_LABEL = "fleet-pipelines.io/sandbox-node"


@pytest.mark.parametrize("owner", sorted(SCORING_PODS))
def test_scoring_pods_give_the_sandbox_what_bubblewrap_needs(owner: str):
    """bwrap (unprivileged, user namespaces) needs a non-root uid (root without CAP_SETFCAP may not
    map uid 0) and seccomp/AppArmor profiles that let it create namespaces and mount; no capability.
    The pod is user-namespaced (its uids are unprivileged on the node) and its /proc stays masked.
    Those profiles exist only on the sandbox nodes, where the installer runs, so the pod is placed
    there."""
    (pod,) = [p for _, o, p in EVERY_POD if o == owner]
    assert pod.get("hostUsers") is False
    assert pod["securityContext"]["runAsUser"] != 0 and pod["securityContext"]["runAsNonRoot"]
    main = pod["containers"][0]["securityContext"]
    assert main["capabilities"] == {"drop": ["ALL"]} and main["allowPrivilegeEscalation"] is False
    assert main.get("procMount", "Default") == "Default"
    assert main["seccompProfile"] == {"type": "Localhost", "localhostProfile": "fleet-sandbox.json"}
    assert main["appArmorProfile"] == {"type": "Localhost", "localhostProfile": "fleet-sandbox"}
    assert (NODE / main["seccompProfile"]["localhostProfile"]).is_file()
    assert (NODE / (main["appArmorProfile"]["localhostProfile"] + ".apparmor")).is_file()
    assert pod["nodeSelector"] == {PROFILES_LABEL: installer_node_label_value()}


def installer_node_label_value() -> str:
    """The value of the sandbox-node label the installer DaemonSet (deploy/node/) selects: it
    installs the profiles on exactly the nodes the scoring pods select."""
    (daemonset,) = [d for d in load_docs(NODE_DIR) if d["kind"] == "DaemonSet"]
    selector = daemonset["spec"]["template"]["spec"]["nodeSelector"]
    return selector[PROFILES_LABEL]


def test_only_profile_bound_pods_name_a_localhost_profile_and_all_are_placed():
    """Any pod that names a Localhost profile is refused by the kubelet of a node without it."""
    for _, owner, pod in EVERY_POD:
        localhost = [
            c["name"]
            for c in [pod, *containers(pod)]
            for key in ("seccompProfile", "appArmorProfile")
            if ((c.get("securityContext") or {}).get(key) or {}).get("type") == "Localhost"
        ]
        assert bool(localhost) == (owner in SCORING_PODS), owner
        if localhost:
            assert (pod.get("nodeSelector") or {}).get(PROFILES_LABEL), owner


def test_no_other_pod_is_user_namespaced():
    for _, owner, pod in EVERY_POD:
        if owner not in SCORING_PODS:
            assert "hostUsers" not in pod, owner
        assert all("procMount" not in (c.get("securityContext") or {}) for c in containers(pod)), owner


def test_the_seccomp_profile_lets_bubblewrap_build_its_sandbox():
    """What the runtime's default profile refuses without CAP_SYS_ADMIN and bwrap needs stays
    allowed; kernel-administration calls stay refused."""
    profile = json.loads((NODE / "fleet-sandbox.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {n for rule in profile["syscalls"] if rule["action"] != "SCMP_ACT_ALLOW" for n in rule["names"]}
    needed = {"clone", "clone3", "unshare", "mount", "umount2", "pivot_root", "setns", "sethostname"}
    assert not needed & denied
    assert {
        "kexec_load",
        "init_module",
        "finit_module",
        "bpf",
        "open_by_handle_at",
        "keyctl",
        "reboot",
    } <= denied


def missing(what: str) -> None:
    """A tool a security test needs is absent: skipped on a developer's machine, a failure in CI
    (`CI=true`), where .ci/run installs it, so the check never silently stops running there."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {what}", pytrace=False)
    pytest.skip(what)


def test_the_apparmor_profile_parses():
    """apparmor_parser compiles the profile without loading it into the kernel."""
    # Debian installs it in /sbin: on root's PATH, not on a user's (`env -i PATH=/usr/bin:/bin`)
    parser = shutil.which("apparmor_parser", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if parser is None:
        missing("apparmor_parser is not installed (Debian: apt-get install apparmor)")
    text = (NODE / "fleet-sandbox.apparmor").read_text()
    assert "profile fleet-sandbox " in text and "\n  mount,\n" in text and "\n  pivot_root,\n" in text
    done = subprocess.run(
        [parser, "-Q", "-K", str(NODE / "fleet-sandbox.apparmor")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


SECCOMP_LOADER = """
import json, os, sys
import seccomp
profile = json.load(open(sys.argv[1]))
assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
for rule in profile["syscalls"]:
    for name in rule["names"]:
        try:
            f.add_rule(seccomp.ERRNO(rule.get("errnoRet", 1)), name)
        except ValueError:
            pass  # not a syscall of this architecture
f.load()
os.execvp(sys.argv[2], sys.argv[2:])
"""
PROBE = "from fleet_pipelines.sandbox import isolation_available as i; print(i())"


def as_the_scoring_pod(profile: Path) -> subprocess.CompletedProcess[str]:
    """The sandbox probe under `profile` (loaded with libseccomp), as the pods' uid 10001 with
    every capability dropped and no_new_privs: the scoring pod's process, less its /proc masks
    and AppArmor profile. The interpreter is the system's Python of the same version (the test
    venv's may sit where uid 10001 cannot read), with this checkout and the venv on its path."""
    system_python = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not system_python.exists():
        missing("needs root, setpriv and the system Python of this version")
    if subprocess.run([str(system_python), "-c", "import seccomp"], capture_output=True).returncode:
        missing("libseccomp's Python binding is not installed (Debian: apt-get install python3-seccomp)")
    site = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    home = tempfile.mkdtemp()
    os.chmod(home, 0o777)
    return subprocess.run(
        [
            str(system_python),
            "-c",
            SECCOMP_LOADER,
            str(profile),
            "setpriv",
            "--reuid=10001",
            "--regid=10001",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "env",
            "-i",
            f"HOME={home}",
            "PATH=/usr/bin:/bin",
            f"PYTHONPATH={ROOT}:{site}",
            str(system_python),
            "-c",
            PROBE,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_sandbox_runs_under_the_seccomp_profile_as_the_pods_user(tmp_path: Path):
    done = as_the_scoring_pod(NODE / "fleet-sandbox.json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("(True, 'bwrap"), done.stdout
    # The evidence names the tier: this process's seccomp filter (the profile just loaded).
    assert "seccomp filter')" in done.stdout, done.stdout
    # What the runtime's default profile refuses without CAP_SYS_ADMIN breaks it: the profile matters.
    default_like = tmp_path / "default-like.json"
    default_like.write_text(
        json.dumps(
            {
                "defaultAction": "SCMP_ACT_ALLOW",
                "syscalls": [
                    {
                        "names": ["unshare", "mount", "umount2", "pivot_root", "setns"],
                        "action": "SCMP_ACT_ERRNO",
                    }
                ],
            }
        )
    )
    refused = as_the_scoring_pod(default_like)
    assert refused.stdout.startswith("(False,"), refused.stdout


def helm_merge(base: Any, overlay: Any) -> Any:
    """Helm's coalescing of a later values file over an earlier one: maps merge key by key, a key
    set to null is deleted, anything else replaces."""
    if not (isinstance(base, dict) and isinstance(overlay, dict)):
        return copy.deepcopy(overlay)
    merged = copy.deepcopy(base)
    for key, value in overlay.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = helm_merge(base.get(key), value)
    return merged


def test_the_seccomp_only_tier_keeps_every_other_setting_of_the_run_pods():
    """On nodes without AppArmor (deploy/helm/sandbox-seccomp-only.yaml over the chart values):
    the run pod loses only its AppArmor field; the seccomp profile, the user namespace and
    `restricted` stay."""
    from .deploy_objects import chart_run_job

    overlay = yaml.safe_load((ROOT / "deploy" / "helm" / "sandbox-seccomp-only.yaml").read_text())
    base_pod = chart_run_job(VALUES)["spec"]["template"]["spec"]
    pod = chart_run_job(helm_merge(VALUES, overlay))["spec"]["template"]["spec"]
    context = pod["containers"][0]["securityContext"]
    assert "appArmorProfile" not in context
    assert context["seccompProfile"] == {"type": "Localhost", "localhostProfile": "fleet-sandbox.json"}
    expected = copy.deepcopy(base_pod)
    del expected["containers"][0]["securityContext"]["appArmorProfile"]
    for p in (expected, pod):  # the run id differs between two launches
        p["containers"][0]["args"] = p["containers"][0]["env"] = None
    assert pod == expected
    for version in POLICY_VERSIONS:
        assert (
            violations(
                chart_run_job(helm_merge(VALUES, overlay))["spec"]["template"]["spec"], "restricted", version
            )
            == {}
        )
