"""The program a repository run executes inside the sandbox (as its main.py), standard library only.

It reads `job.json` from the work dir and deletes it (the hidden tests stay in this process's
memory), copies the read-only workspace (/mnt/repo) to /work/repo and then, as the job asks:
applies a patch with `git apply --check` then `git apply` (no repository, no configuration: no
hook or filter can run), runs the counted test sessions across the boundary (`boundary.py`: the
base commit's tests with the test command's arguments, then the hidden tests; first on the
unpatched copy when the job asks for the plan), the test command in process when it is not
pytest (forgeable: the host says so), ruff on the changed Python files, or one agent tool (list,
read, search, the test command).

Nothing outlives a command: this process is the sandbox's child subreaper, and before each
command it kills every other process of the sandbox, wipes what the last one left in the work dir
and /dev/shm, and rebuilds the copy when anything in it changed (`Job.fresh`). Each command runs
as a child with its own pipes and a time limit; this process is non-dumpable, so no child can
reach its stdout. The report is the last line of stdout, after REPORT_MARK.
"""

import contextlib
import ctypes
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
import types
import xml.etree.ElementTree as ElementTree

REPORT_MARK = "FLEET-JOB-REPORT "
WORK = "/work"
REPO = "/work/repo"
EXCERPT = 1_500
MAX_FAILING = 50


def excerpt(text, limit=EXCERPT):
    if len(text) <= limit:
        return text
    return text[: limit // 3] + "\n...\n" + text[-(2 * limit) // 3 :]


def environment(job):
    """The environment of every command: the dependency environment importable, nothing else."""
    return {
        "PATH": "/work/.bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": WORK,
        "TMPDIR": WORK,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # no plugin of the patch's (dist-info entry points)
        "PYTHONPATH": ":".join(p for p in ("/mnt/env",) if os.path.isdir(p)),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CEILING_DIRECTORIES": WORK,
    }


def in_process_environment(job, cwd):
    """The environment of a command that runs the repository in process (the test command, as
    the baseline and the agents' run_tests tool run it): the repository importable after the
    standard library and the environment (a sitecustomize of ours appends it; PYTHONSAFEPATH:
    no working directory ahead of the standard library), never ahead of them."""
    boot = "/work/.fleet/boot"
    os.makedirs(boot, exist_ok=True)
    with open(f"{boot}/sitecustomize.py", "w") as f:
        f.write(f"import sys\nsys.path.extend({[cwd, os.path.join(cwd, 'src')]!r})\n")
    env = environment(job)
    env["PYTHONPATH"] = ":".join([boot, *filter(None, [env["PYTHONPATH"]])])
    env["PYTHONSAFEPATH"] = "1"
    return env


def run(argv, cwd, env, timeout_s):
    start = time.monotonic()
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        return None, out.decode(errors="replace"), time.monotonic() - start
    except OSError as exc:
        return 127, f"cannot run {argv[0]}: {exc}", time.monotonic() - start
    out = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    return done.returncode, out, time.monotonic() - start


def junit_counts(path):
    """passed, failed (failures + errors), skipped, failing ids, first failure from a junit XML."""
    root = ElementTree.parse(path).getroot()
    passed = failed = skipped = 0
    failing, first = [], ""
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            failed += 1
            if len(failing) < MAX_FAILING:
                failing.append(name)
            if not first:
                first = f"{name}: {bad.get('message', '')}\n{bad.text or ''}"
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failing, excerpt(first)


def tests(argv, cwd, env, timeout_s, report_file, ran, require_report=False):
    """One test run; with `require_report`, a run that leaves no pytest report with at least one
    test is an error whatever its exit status (code under test that ends the process early, e.g.
    `os._exit(0)` on import, would otherwise pass)."""
    env = dict(env)
    env["PYTEST_ADDOPTS"] = f"-p no:cacheprovider --import-mode=append --junitxml={report_file}"
    if os.path.exists(report_file):
        os.unlink(report_file)
    code, out, duration = run(argv, cwd, env, timeout_s)
    status = "timeout" if code is None else "passed" if code == 0 else "failed"
    evidence = {"status": status, "ran": ran, "output": excerpt(out), "duration_s": round(duration, 3)}
    if os.path.exists(report_file):
        try:
            passed, failed, skipped, failing, first = junit_counts(report_file)
            evidence.update(
                passed=passed,
                failed=failed,
                skipped=skipped,
                failing=failing,
                first_failure=first,
                counted=True,
            )
        except (ElementTree.ParseError, OSError):
            pass
    reported = evidence.get("counted") and evidence["passed"] + evidence["failed"] > 0
    if require_report and status != "timeout" and not reported:
        evidence["status"] = status = "error"
        evidence["first_failure"] = (
            f"no test report: the run exited ({code}) before pytest reported its tests"
        )
    if status != "passed" and not evidence.get("first_failure"):
        evidence["first_failure"] = (
            excerpt(out, 600) if code is not None else f"timed out after {timeout_s} s"
        )
    return evidence


def shims(python):
    os.makedirs("/work/.bin", exist_ok=True)
    for name in ("python", "python3"):
        os.symlink(python, f"/work/.bin/{name}")
    with open("/work/.bin/pytest", "w") as f:
        f.write(f"#!{python}\nimport sys\nimport pytest\nsys.exit(pytest.main())\n")
    os.chmod("/work/.bin/pytest", 0o755)


def apply_patch(git, patch, env):
    with open("/work/.fleet/patch.diff", "w") as f:
        f.write(patch)
    code, out, _ = run([git, "apply", "--check", "-v", "/work/.fleet/patch.diff"], REPO, env, 60)
    if code != 0:
        return False, excerpt(out)
    code, out2, _ = run([git, "apply", "/work/.fleet/patch.diff"], REPO, env, 60)
    return code == 0, excerpt(out + out2)


def ruff(job, env, changed):
    files = [p for p in changed if p.endswith(".py") and os.path.isfile(os.path.join(REPO, p))]
    if not job.get("ruff") or not files:
        return None, "no changed Python file" if job.get("ruff") else "ruff not available"
    argv = [job["ruff"], "check", "--isolated", "--no-cache", "--select", job["ruff_rules"]]
    _, out, _ = run([*argv, "--output-format", "json", "--", *files], REPO, env, 60)
    try:
        issues = json.loads(out[out.index("[") :]) if "[" in out else []
    except ValueError:
        return None, excerpt(out)
    lines = [
        f"{i['filename'].removeprefix(REPO + '/')}:{i['location']['row']}: {i.get('code')} {i['message']}"
        for i in issues
    ]
    return len(issues), excerpt("\n".join(lines))


def tool(job, cwd):
    """One agent tool on the (patched) copy: list, read, search."""
    name, args = job["tool"], job.get("args", {})
    limit = job.get("max_chars", 6_000)
    if name == "list_files":
        base = os.path.normpath(os.path.join(cwd, args.get("path", ".")))
        if not base.startswith(REPO):
            return "error: path outside the repository"
        found = []
        for directory, dirs, files in os.walk(base):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for f in sorted(files):
                found.append(os.path.relpath(os.path.join(directory, f), cwd))
        return excerpt("\n".join(found), limit)
    if name == "read_file":
        path = os.path.normpath(os.path.join(cwd, str(args.get("path", ""))))
        if not path.startswith(REPO + "/") or not os.path.isfile(path):
            return f"error: no file {args.get('path')!r} in the repository"
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
        start = max(1, int(args.get("start_line", 1)))
        end = min(len(lines), int(args.get("end_line", start + 199)))
        return excerpt("\n".join(f"{i}: {lines[i - 1]}" for i in range(start, end + 1)), limit)
    if name == "search_text":
        pattern = re.compile(re.escape(str(args.get("text", ""))))
        hits = []
        for directory, dirs, files in os.walk(cwd):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for f in sorted(files):
                path = os.path.join(directory, f)
                try:
                    with open(path, errors="strict") as handle:
                        for number, line in enumerate(handle, 1):
                            if pattern.search(line):
                                hits.append(f"{os.path.relpath(path, cwd)}:{number}: {line.rstrip()[:200]}")
                except (UnicodeDecodeError, OSError):
                    continue
                if len(hits) >= 100:
                    break
        return excerpt("\n".join(hits) or "no match", limit)
    return f"error: unknown tool {name!r}"


def wipe(path):
    """Removes `path` whatever modes the last command left on it (its folders made 0700 first,
    top down, so each can be listed and emptied)."""
    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    os.chmod(path, 0o700)
    for directory, dirs, _files in os.walk(path):
        for name in dirs:
            folder = os.path.join(directory, name)
            if not os.path.islink(folder):
                os.chmod(folder, 0o700)
    shutil.rmtree(path)


def kill_all():
    """Every other process of the sandbox (pid 1 aside), then their exit statuses: we are the
    child subreaper, so whatever a command left behind is reparented here and reaped."""
    for _ in range(100):
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
        try:
            os.kill(-1, 0)
        except ProcessLookupError:
            return
    raise RuntimeError("processes of a command outlived it")


def snapshot(root):
    """What changes whenever a file under `root` is written, made, removed or relinked."""
    seen = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            seen[path] = (info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
    return seen


def changed_paths(base, patched):
    """Files (and links) that differ between the base tree and the patched one, relative paths."""

    def files(root):
        found = {}
        for directory, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(directory, name)
                info = os.lstat(path)
                link = os.readlink(path) if os.path.islink(path) else None
                found[os.path.relpath(path, root)] = (
                    info.st_mode | 0o200,
                    info.st_size,
                    info.st_mtime_ns,
                    link,
                )
        return found

    before, after = files(base), files(patched)
    changed = []
    for path in sorted(before.keys() | after.keys()):
        a, b = before.get(path), after.get(path)
        if a is None or b is None or a[3] is not None or b[3] is not None:
            if a != b and (a is None or b is None or (a[0], a[3]) != (b[0], b[3])):
                changed.append(path)
        elif a != b:
            changed.append(path)
    return changed


PYTEST_SECTION = re.compile(r"^\[(tool:pytest|pytest|tool\.pytest[^\]]*)\]", re.MULTILINE)


def pytest_section(path):
    """The pytest configuration a file holds (its [pytest], [tool:pytest] or [tool.pytest...]
    sections), "" when none or no file."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    found = []
    for match in PYTEST_SECTION.finditer(text):
        end = text.find("\n[", match.end())
        found.append(text[match.start() : end if end >= 0 else len(text)])
    return "\n".join(found)


def config_changes(changed):
    """The changed configuration files whose pytest configuration the patch changed."""
    names = ("pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")
    return [
        p
        for p in changed
        if os.path.basename(p) in names
        and pytest_section(os.path.join("/mnt/repo", p)) != pytest_section(os.path.join(REPO, p))
    ]


class Job:
    """The job's state: the patched copy as it must be before each command."""

    def __init__(self, job, patch):
        self.job = job
        self.patch = patch
        self.snapshot = None
        self.applies = True
        self.apply_output = ""

    def build(self):
        """/work/repo: the read-only workspace copied, the patch applied."""
        wipe(REPO)
        shutil.copytree("/mnt/repo", REPO, symlinks=True)
        for directory, _dirs, files in os.walk(REPO):  # the copy is ours to change
            os.chmod(directory, 0o755)
            for name in files:
                path = os.path.join(directory, name)
                if not os.path.islink(path):
                    os.chmod(path, os.stat(path).st_mode | 0o200)
        os.makedirs("/work/.fleet", exist_ok=True)
        if self.patch is not None:
            self.applies, self.apply_output = apply_patch(self.job["git"], self.patch, environment(self.job))
        self.snapshot = snapshot(REPO)

    def fresh(self):
        """Before a command: no process of the one before, no file it left outside the copy, and
        the copy as the patch left it (rebuilt when anything in it changed)."""
        kill_all()
        for folder in (WORK, "/dev/shm"):  # as the last command may have left their modes
            with contextlib.suppress(OSError):
                os.chmod(folder, 0o700)
        for name in os.listdir(WORK):
            if name not in ("repo", "main.py"):
                wipe(os.path.join(WORK, name))
        for name in os.listdir("/dev/shm"):
            wipe(os.path.join("/dev/shm", name))
        if snapshot(REPO) != self.snapshot:
            self.build()
        os.makedirs("/work/.fleet", exist_ok=True)


def drain(fds, timeout_s):
    """Everything written to `fds` until each is closed or `timeout_s` passed; False: timed out."""
    chunks = {fd: [] for fd in fds}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    open_fds = set(fds)
    deadline = time.monotonic() + timeout_s
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return {fd: b"".join(c) for fd, c in chunks.items()}, False
        for fd, _event in poller.poll(left * 1000):
            data = os.read(fd, 65536)
            if data:
                chunks[fd].append(data)
            else:
                poller.unregister(fd)
                open_fds.discard(fd)
    return {fd: b"".join(c) for fd, c in chunks.items()}, True


def session(state, boundary, job, args=None, hidden=None):
    """One counted test session across the boundary (boundary.py), in a fresh state; its
    outcomes read from a pipe only the test process holds."""
    state.fresh()
    cwd = os.path.join(REPO, job.get("subdir", ""))
    base = os.path.join("/mnt/repo", job.get("subdir", ""))
    spec = {
        "wire_path": "/fleet/init.py",
        "source": job["boundary_source"],
        "args": list(args or []),
        "cwd": base,  # the base's tests, read-only: the patch cannot change them
        "code_cwd": cwd,  # the code under test runs in the patched copy
        "roots": [cwd, os.path.join(cwd, "src")],
        "base_roots": [base, os.path.join(base, "src")],
        "env_paths": [p for p in ("/mnt/env",) if os.path.isdir(p)],
        "env": {k: v for k, v in environment(job).items() if k != "PYTHONPATH"},
        "hidden_source": hidden,
    }
    start = time.monotonic()
    results_r, results_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the test process
        try:
            os.close(results_r)
            os.close(out_r)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            sys.stdout = sys.stderr = open(1, "w", closefd=False)  # noqa: SIM115 (never returns)
            boundary.run_session(spec, results_w)
        finally:
            os._exit(70)
    os.close(results_w)
    os.close(out_w)
    data, finished = drain([results_r, out_r], job["timeout_s"])
    os.close(results_r)
    os.close(out_r)
    kill_all()
    report = {
        "results": {},
        "collected": [],
        "collect_errors": [],
        "done": False,
        "timeout": not finished,
        "output": excerpt(data[out_r].decode(errors="replace")),
        "duration_s": round(time.monotonic() - start, 3),
    }
    for line in data[results_r].decode(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "id" in entry:
            report["results"][entry["id"]] = {"outcome": entry["outcome"], "detail": entry["detail"]}
        elif "collected" in entry:
            report["collected"].append(entry["collected"])
        elif "collect_error" in entry:
            report["collect_errors"].append([entry["collect_error"], entry["detail"]])
        elif entry.get("done"):
            report["done"], report["exit"] = True, entry["exit"]
        elif "harness_error" in entry:
            report["harness_error"] = entry["harness_error"]
    return report


def load_boundary(source):
    """boundary.py as a module, with pytest and its built-in plugins imported here from the
    environment, before any code under test runs: each test process (a fork) starts with them."""
    module = types.ModuleType("fleet_boundary")
    exec(compile(source, "boundary.py", "exec"), module.__dict__)
    if os.path.isdir("/mnt/env"):
        sys.path.append("/mnt/env")
        try:
            module.preload()
        finally:
            sys.path.remove("/mnt/env")
    return module


def main():
    libc = ctypes.CDLL(None)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no child opens our stdout via /proc
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: what a command leaves behind is ours to end
    with open("job.json") as f:
        job = json.load(f)
    os.unlink("job.json")  # the hidden tests are in our memory only
    started = time.monotonic()
    boundary = load_boundary(job["boundary_source"]) if "boundary_source" in job else None
    report = {}
    if job.get("plan"):  # the base commit's sessions first: what counts, before the patch
        state = Job(job, None)
        state.build()
        if job.get("visible_args") is not None:
            report["plan_visible"] = session(state, boundary, job, args=job["visible_args"])
        if job.get("hidden_tests"):
            report["plan_hidden"] = session(state, boundary, job, hidden=job["hidden_tests"])
        if job.get("patch") is None:
            kill_all()
            print(REPORT_MARK + json.dumps(report))
            return
    state = Job(job, job.get("patch"))
    state.build()
    cwd = os.path.join(REPO, job.get("subdir", ""))
    if job.get("patch") is not None:
        report.update(applies=state.applies, apply_output=state.apply_output)
        if not state.applies:
            print(REPORT_MARK + json.dumps(report))
            return
        report["changed"] = changed_paths("/mnt/repo", REPO)
        report["pytest_config_changed"] = config_changes(report["changed"])
    if job.get("tool"):
        try:
            report["tool_output"] = tool(job, cwd)
        except (ValueError, TypeError, OSError, re.error) as exc:  # the model's arguments
            report["tool_output"] = f"error: {exc}"
    if job.get("visible_args") is not None:
        report["visible"] = session(state, boundary, job, args=job["visible_args"])
    elif job.get("test_command"):
        state.fresh()
        shims(sys.executable)
        report["tests"] = tests(
            shlex.split(job["test_command"]),
            cwd,
            in_process_environment(job, cwd),
            job["timeout_s"],
            "/work/.fleet/visible.xml",
            f"{job['test_command']} (in {job.get('subdir') or '.'})",
            require_report=bool(job.get("require_report")),
        )
    if job.get("ruff_changed") is not None:
        state.fresh()
        changed = report.get("changed", job["ruff_changed"])
        report["ruff_issues"], report["ruff_output"] = ruff(job, environment(job), changed)
    if job.get("hidden_tests"):
        report["hidden"] = session(state, boundary, job, hidden=job["hidden_tests"])
    kill_all()
    report["job_s"] = round(time.monotonic() - started, 3)
    print(REPORT_MARK + json.dumps(report))


if __name__ == "__main__":
    main()
