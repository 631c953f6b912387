"""PID 1 of a sandbox: sets up its mount namespace, then runs the untrusted program as a child.

Started by `sandbox.run_python` under `unshare --mount --net --pid --fork --kill-child --mount-proc`
(plus `--map-root-user` when the caller is not root), with `python -I -S`, so it imports only the
standard library. Steps, each failing closed (a failed step reports an error, the program never runs):

1. every mount becomes private (nothing propagates back to the host);
2. the work dir is bound onto itself, the Python installation is bound read-only under it
   (`.python`: the interpreter stays reachable when the sandbox user cannot read its real path);
3. every mount point except the work dir is remounted read-only (nosuid/nodev/noexec kept);
4. the child sets rlimits, drops every capability from its bounding set, sets no_new_privs, takes
   the sandbox uid/gid (nobody when started as root) and execs Python on `main.py`.

PID 1 reaps orphans and reports the child's exit code or signal as one JSON line on the status fd.
When PID 1 dies (the caller kills it at the wall limit), the kernel kills every process of the
namespace: a fork bomb or a daemonised child cannot outlive the sandbox.
"""

import ctypes
import json
import os
import resource
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
KEPT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
SETUP_FAILED = 125

libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str | None, target: str, flags: int) -> None:
    src = None if source is None else source.encode()
    if libc.mount(src, target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def mount_points() -> dict[str, int]:
    """Mount point -> the per-mount flags to keep, from /proc/self/mountinfo."""
    points: dict[str, int] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            target = fields[4].encode().decode("unicode_escape")
            points[target] = sum(KEPT_FLAGS.get(opt, 0) for opt in fields[5].split(","))
    return points


def setup_mounts(work: str, python_prefix: str) -> None:
    mount(None, "/", MS_REC | MS_PRIVATE)
    mount(work, work, MS_BIND)
    python_dir = os.path.join(work, ".python")
    os.mkdir(python_dir)
    mount(python_prefix, python_dir, MS_BIND | MS_REC)
    for target, kept in sorted(mount_points().items()):
        if target != work:
            mount(None, target, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
    mount(None, work, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)


def drop_privileges(uid: int | None) -> None:
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def run_child(cfg: dict, exec_error_fd: int) -> None:
    """In the forked child: limits, privileges, exec. Never returns; a failure before the exec
    is written to `exec_error_fd` (close-on-exec, so a successful exec leaves it empty)."""
    try:
        mb = 1024 * 1024
        for limit, value in (
            (resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1)),
            (resource.RLIMIT_AS, (cfg["memory_mb"] * mb,) * 2),
            (resource.RLIMIT_NPROC, (cfg["max_processes"],) * 2),
            (resource.RLIMIT_FSIZE, (cfg["max_file_mb"] * mb,) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ):
            resource.setrlimit(limit, value)
        drop_privileges(cfg["uid"])
        os.chdir(cfg["work"])
        os.closerange(3, exec_error_fd)
        os.closerange(exec_error_fd + 1, 1024)
        python = os.path.join(cfg["work"], ".python", cfg["python_rel"])
        os.execve(python, [python, "-B", "-E", "-s", "main.py"], cfg["env"])
    except BaseException as exc:  # report and leave; the program did not run
        os.write(exec_error_fd, repr(exc).encode())
        os._exit(SETUP_FAILED)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    status_fd = cfg["status_fd"]

    def report(**fields) -> None:
        os.write(status_fd, (json.dumps(fields) + "\n").encode())

    try:
        setup_mounts(cfg["work"], cfg["python_prefix"])
    except OSError as exc:
        report(setup_error=str(exc))
        sys.exit(SETUP_FAILED)
    exec_error_r, exec_error_w = os.pipe()  # both close-on-exec
    child = os.fork()
    if child == 0:
        os.close(status_fd)
        os.close(exec_error_r)
        run_child(cfg, exec_error_w)
    os.close(exec_error_w)
    exec_error = os.read(exec_error_r, 4096).decode(errors="replace")
    if exec_error:
        os.waitpid(child, 0)
        report(setup_error=f"could not start the program: {exec_error}")
        sys.exit(SETUP_FAILED)
    while True:  # PID 1 reaps every orphan until the program itself exits
        pid, status, usage = os.wait4(-1, 0)
        if pid == child:
            break
    cpu_s = round(usage.ru_utime + usage.ru_stime, 3)
    if os.WIFSIGNALED(status):
        report(signal=signal.Signals(os.WTERMSIG(status)).name, cpu_s=cpu_s)
    else:
        report(returncode=os.WEXITSTATUS(status), cpu_s=cpu_s)
    sys.exit(0)


if __name__ == "__main__":
    main()
