"""No pod of deploy/ runs as root: every pod spec, on every route (plain manifests, the pods the
Dagster and NATS charts render from our values, Dagster's run pods, the containers the KubeRay
operator adds), passes the "restricted" Pod Security Standard that deploy/k8s/config.yaml's
namespace enforces. The checker below follows the standard's controls as Kubernetes 1.33
documents them (Baseline + Restricted) at policy version v1.35, where a user-namespaced pod
(`hostUsers: false`) may unmask /proc; it is not the admission plugin itself, which is Go.

The scoring pods (Dagster run pods, Ray workers) also give the sandbox what bubblewrap needs, as
issue #12 measured it: a user namespace of their own, an unmasked /proc, and the Localhost seccomp
and AppArmor profiles shipped in deploy/node/."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from .deploy_objects import (
    DAGSTER_DIR,
    K8S,
    NATS_VALUES,
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

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def restricted_violations(pod: Pod) -> list[str]:
    """Every control of the restricted profile the pod spec breaks."""
    found = []
    pod_sc = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"{field} is set")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']} has type {sorted(kinds)}")
    for sysctl in pod_sc.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']}")
    if (pod_sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        found.append("pod AppArmor profile Unconfined")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_sc.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    for container in containers(pod):
        name = container["name"]
        sc = container.get("securityContext") or {}
        if sc.get("privileged"):
            found.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            found.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {caps['add']}")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile is {seccomp or 'unset'}")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            found.append(f"{name}: AppArmor profile Unconfined")
        if sc.get("procMount", "Default") != "Default" and pod.get("hostUsers") is not False:
            found.append(f"{name}: procMount {sc['procMount']} outside a user namespace")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                found.append(f"{name}: hostPort {port['hostPort']}")
    return found


def every_pod() -> list[tuple[str, Pod]]:
    return [
        *workload_pods(load_docs(K8S)),
        *workload_pods(load_docs(DAGSTER_DIR)),
        ("dagster.yaml/run", instance_run_job()["spec"]["template"]["spec"]),
        *chart_pods(VALUES),
        *nats_pods(NATS_VALUES),
    ]


def test_every_route_has_its_pods_here():
    owners = {owner for owner, _ in every_pod()}
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
    }


@pytest.mark.parametrize(("owner", "pod"), every_pod(), ids=[o for o, _ in every_pod()])
def test_pod_passes_the_restricted_pod_security_standard(owner: str, pod: Pod):
    assert restricted_violations(pod) == []


@pytest.mark.parametrize(("owner", "pod"), every_pod(), ids=[o for o, _ in every_pod()])
def test_no_container_needs_a_privileged_port(owner: str, pod: Pod):
    """Without capabilities a non-root process cannot bind a port below 1024."""
    for container in containers(pod):
        for port in container.get("ports", []):
            assert port["containerPort"] >= 1024, (owner, container["name"], port)


def test_the_checker_catches_each_way_to_run_as_root():
    _, pod = workload_pods(load_docs(K8S))[0]
    assert restricted_violations(pod) == []
    breaks = {
        "runAsNonRoot": lambda p: p["securityContext"].pop("runAsNonRoot"),
        "allowPrivilegeEscalation": lambda p: p["containers"][0]["securityContext"].pop(
            "allowPrivilegeEscalation"
        ),
        "drop ALL": lambda p: p["containers"][0]["securityContext"].pop("capabilities"),
        "seccompProfile": lambda p: p["securityContext"].pop("seccompProfile"),
        "privileged": lambda p: p["containers"][0]["securityContext"].update(privileged=True),
        "runAsUser 0": lambda p: p["containers"][0]["securityContext"].update(runAsUser=0),
        "hostPath": lambda p: p.setdefault("volumes", []).append({"name": "h", "hostPath": {"path": "/"}}),
        "SYS_ADMIN": lambda p: p["containers"][0]["securityContext"]["capabilities"].update(
            add=["SYS_ADMIN"]
        ),
        "Unconfined": lambda p: p["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "AppArmor": lambda p: p["containers"][0]["securityContext"].update(
            appArmorProfile={"type": "Unconfined"}
        ),
        "procMount": lambda p: p["containers"][0]["securityContext"].update(procMount="Unmasked"),
    }
    for what, apply in breaks.items():
        broken = copy.deepcopy(pod)
        apply(broken)
        assert restricted_violations(broken), what


def test_pods_run_as_the_images_user():
    """The image's USER owns DAGSTER_HOME and the venv's writable paths; pods pin the same uid."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    users = set(re.findall(r"^USER (\d+):(\d+)$", dockerfile, flags=re.MULTILINE))
    assert users == {("10001", "10001")}
    for owner, pod in every_pod():
        if owner.startswith("chart/nats"):
            continue  # the upstream NATS image
        uid = (pod.get("securityContext") or {}).get("runAsUser")
        assert uid == 10001, owner


def test_the_namespace_enforces_the_restricted_level():
    (namespace,) = [d for d in load_docs(K8S) if d["kind"] == "Namespace"]
    labels: dict[str, Any] = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


SCORING_PODS = {"RayCluster/cpu", "RayCluster/gpu", "dagster.yaml/run", "chart/run"}
NODE = ROOT / "deploy" / "node"


@pytest.mark.parametrize("owner", sorted(SCORING_PODS))
def test_scoring_pods_give_the_sandbox_what_bubblewrap_needs(owner: str):
    """bwrap (unprivileged, user namespaces) needs a non-root uid (root without CAP_SETFCAP may not
    map uid 0), a fresh /proc (so an unmasked one, allowed only in a user-namespaced pod), and
    seccomp/AppArmor profiles that let it create namespaces and mount; no capability."""
    (pod,) = [p for o, p in every_pod() if o == owner]
    assert pod.get("hostUsers") is False
    assert pod["securityContext"]["runAsUser"] != 0 and pod["securityContext"]["runAsNonRoot"]
    main = pod["containers"][0]["securityContext"]
    assert main["capabilities"] == {"drop": ["ALL"]} and main["allowPrivilegeEscalation"] is False
    assert main["procMount"] == "Unmasked"
    assert main["seccompProfile"] == {"type": "Localhost", "localhostProfile": "fleet-sandbox.json"}
    assert main["appArmorProfile"] == {"type": "Localhost", "localhostProfile": "fleet-sandbox"}
    assert (NODE / main["seccompProfile"]["localhostProfile"]).is_file()
    assert (NODE / (main["appArmorProfile"]["localhostProfile"] + ".apparmor")).is_file()


def test_no_other_pod_is_user_namespaced_or_unmasked():
    for owner, pod in every_pod():
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


def test_the_apparmor_profile_parses():
    """apparmor_parser compiles the profile without loading it into the kernel."""
    parser = shutil.which("apparmor_parser")
    if parser is None:
        pytest.skip("apparmor_parser is not installed (Debian: apt-get install apparmor)")
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
PROBE = "from fleet_pipelines.scoring.sandbox import isolation_available as i; print(i())"


def as_the_scoring_pod(profile: Path) -> subprocess.CompletedProcess[str]:
    """The sandbox probe under `profile` (loaded with libseccomp), as the pods' uid 10001 with
    every capability dropped and no_new_privs: the scoring pod's process, less its /proc masks
    and AppArmor profile. The interpreter is the system's Python of the same version (the test
    venv's may sit where uid 10001 cannot read), with this checkout and the venv on its path."""
    system_python = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not system_python.exists():
        pytest.skip("needs root, setpriv and the system Python of this version")
    if subprocess.run([str(system_python), "-c", "import seccomp"], capture_output=True).returncode:
        pytest.skip("libseccomp's Python binding is not installed (Debian: apt-get install python3-seccomp)")
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
