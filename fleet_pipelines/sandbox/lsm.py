"""The kernel confinement the sandbox's own process runs under, for its evidence: which Linux
security module confines it (AppArmor and its profile, SELinux and its context, or none) and
whether a seccomp filter is on. On a cluster this names the tier a scoring pod ran in: an
AppArmor node with the fleet-sandbox profile, an SELinux node (container_t), or a node with
neither, where the pod's seccomp profile is the only confinement the node adds (deploy/README.md,
"Sandbox tiers").

Read from the process's own files: /proc/self/attr/apparmor/current (AppArmor's own interface,
Linux >= 5.8), else /proc/self/attr/current (the major LSM's), told apart by which module is
mounted (/sys/kernel/security/apparmor, /sys/fs/selinux); /proc/self/status for seccomp.
"""

from __future__ import annotations

from pathlib import Path

_SECCOMP_MODES = {"0": "no seccomp", "1": "seccomp strict", "2": "seccomp filter"}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip().rstrip("\x00").strip()
    except OSError:  # absent, or EINVAL where no LSM provides the attribute
        return None


def confinement(root: Path = Path("/")) -> str:
    """`confinement: <LSM and label>, <seccomp mode>`, e.g. `confinement: apparmor fleet-sandbox
    (enforce), seccomp filter`, `confinement: selinux system_u:system_r:container_t:s0:c1,c2,
    seccomp filter` or `confinement: no LSM, seccomp filter`. `root` is where /proc and /sys are
    (tests point it at a copy of another kind of node's files)."""
    proc = root / "proc" / "self"
    apparmor = _read(proc / "attr" / "apparmor" / "current")
    current = _read(proc / "attr" / "current")
    if apparmor is not None:
        lsm = f"apparmor {apparmor}"
    elif current and (root / "sys" / "fs" / "selinux").is_dir():
        lsm = f"selinux {current}"
    elif current and (root / "sys" / "kernel" / "security" / "apparmor").is_dir():
        lsm = f"apparmor {current}"
    else:
        lsm = "no LSM"
    seccomp = "seccomp unknown"
    for line in (_read(proc / "status") or "").splitlines():
        if line.startswith("Seccomp:"):
            seccomp = _SECCOMP_MODES.get(line.split(":", 1)[1].strip(), "seccomp unknown")
    return f"confinement: {lsm}, {seccomp}"
