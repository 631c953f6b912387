"""The sandbox's evidence names the node's tier (fleet_pipelines/sandbox/lsm.py): AppArmor and its
profile, SELinux and its context, or no LSM, and the seccomp mode. This machine has one kind of
node; the others are fakes of the kernel's files (named as such), laid out as each kind of node
shows them to a container: an AppArmor node running the fleet-sandbox profile (GKE COS, Ubuntu),
an SELinux node (EKS AL2023, Bottlerocket, RHEL: container_t with MCS categories), and a node with
neither (kind on a host without AppArmor)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_pipelines.sandbox import isolation_available, lsm


def fake_node(tmp_path: Path, files: dict[str, str], dirs: tuple[str, ...] = ()) -> Path:
    """A fake of a node's /proc/self and /sys as a container there sees them."""
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for name in dirs:
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
    return tmp_path


STATUS_FILTER = "Name:\tpython\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n"


@pytest.mark.parametrize(
    ("files", "dirs", "expected"),
    [
        (
            {
                "proc/self/attr/apparmor/current": "fleet-sandbox (enforce)\n",
                "proc/self/attr/current": "fleet-sandbox (enforce)\n",
                "proc/self/status": STATUS_FILTER,
            },
            ("sys/kernel/security/apparmor",),
            "confinement: apparmor fleet-sandbox (enforce), seccomp filter",
        ),
        (  # a kernel before 5.8: AppArmor only through the major LSM's attribute
            {"proc/self/attr/current": "fleet-sandbox (enforce)\n", "proc/self/status": STATUS_FILTER},
            ("sys/kernel/security/apparmor",),
            "confinement: apparmor fleet-sandbox (enforce), seccomp filter",
        ),
        (
            {
                "proc/self/attr/current": "system_u:system_r:container_t:s0:c170,c615\x00",
                "proc/self/status": STATUS_FILTER,
            },
            ("sys/fs/selinux",),
            "confinement: selinux system_u:system_r:container_t:s0:c170,c615, seccomp filter",
        ),
        ({"proc/self/status": STATUS_FILTER}, (), "confinement: no LSM, seccomp filter"),
        ({"proc/self/status": "Seccomp:\t0\n"}, (), "confinement: no LSM, no seccomp"),
    ],
    ids=["apparmor", "apparmor-legacy-attr", "selinux", "seccomp-only", "nothing"],
)
def test_the_tier_is_read_from_the_processes_own_files(
    tmp_path: Path, files: dict[str, str], dirs: tuple[str, ...], expected: str
):
    assert lsm.confinement(fake_node(tmp_path, files, dirs)) == expected


def test_this_process_is_described_as_the_kernel_says():
    """The real files: the seccomp mode of /proc/self/status, and the LSM this kernel has."""
    status = Path("/proc/self/status").read_text()
    mode = next(line.split(":")[1].strip() for line in status.splitlines() if line.startswith("Seccomp:"))
    described = lsm.confinement()
    assert described.endswith({"0": "no seccomp", "1": "seccomp strict", "2": "seccomp filter"}[mode])
    if not Path("/sys/fs/selinux").is_dir() and not Path("/sys/kernel/security/apparmor").is_dir():
        assert described.startswith("confinement: no LSM")


def test_the_sandbox_names_its_tier():
    available, how = isolation_available()
    if available:
        assert how.endswith(lsm.confinement())
