"""The program a repository run executes inside the sandbox (as its main.py), standard library only.

It reads `job.json` from the work dir, copies the read-only workspace (/mnt/repo) to /work/repo
and then, as the job asks: applies a patch with `git apply --check` then `git apply` (no
repository, no configuration: no hook or filter can run), runs the test command, ruff on the
changed Python files, the hidden tests (with their own pytest configuration and no conftest),
or one agent tool (list, read, search). Each command runs as a child with its own pipes and a
time limit; this process is non-dumpable, so no child can reach its stdout. The report is the
last line of stdout, after REPORT_MARK.
"""

import ctypes
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
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


def environment(job, extra_path=()):
    paths = [p for p in (*extra_path, "/mnt/env") if os.path.isdir(p)]
    return {
        "PATH": "/work/.bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": WORK,
        "TMPDIR": WORK,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": ":".join(paths),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CEILING_DIRECTORIES": WORK,
    }


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
    env["PYTEST_ADDOPTS"] = f"-p no:cacheprovider --junitxml={report_file}"
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


def apply_patch(job, env):
    with open("/work/.fleet/patch.diff", "w") as f:
        f.write(job["patch"])
    git = job["git"]
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


def main():
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no child opens our stdout via /proc
    with open("job.json") as f:
        job = json.load(f)
    started = time.monotonic()
    shutil.copytree("/mnt/repo", REPO, symlinks=True)
    for directory, _dirs, files in os.walk(REPO):  # the copy is ours to change
        os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o200)
    os.makedirs("/work/.fleet", exist_ok=True)
    shims(sys.executable)
    cwd = os.path.join(REPO, job.get("subdir", ""))
    source_paths = [cwd, os.path.join(cwd, "src")]
    env = environment(job, source_paths)
    report = {}
    if job.get("patch") is not None:
        applies, out = apply_patch(job, env)
        report.update(applies=applies, apply_output=out)
        if not applies:
            print(REPORT_MARK + json.dumps(report))
            return
    if job.get("tool"):
        try:
            report["tool_output"] = tool(job, cwd)
        except (ValueError, TypeError, OSError, re.error) as exc:  # the model's arguments
            report["tool_output"] = f"error: {exc}"
    if job.get("test_command"):
        argv = shlex.split(job["test_command"])
        report["tests"] = tests(
            argv,
            cwd,
            env,
            job["timeout_s"],
            "/work/.fleet/visible.xml",
            f"{job['test_command']} (in {job.get('subdir') or '.'})",
            require_report=bool(job.get("require_report")),
        )
    if job.get("ruff_changed") is not None:
        report["ruff_issues"], report["ruff_output"] = ruff(job, env, job["ruff_changed"])
    if job.get("hidden_tests"):
        hidden = "/work/.fleet/hidden"
        os.makedirs(hidden)
        with open(f"{hidden}/test_fleet_hidden.py", "w") as f:
            f.write(job["hidden_tests"])
        with open(f"{hidden}/pytest.ini", "w") as f:
            f.write("[pytest]\n")
        # isolated (-I): no PYTHONPATH at start-up, so no sitecustomize or `pytest` of the patch's
        # runs before pytest; the environment comes first on sys.path, the repository after it
        args = ["-q", "--noconftest", "-c", f"{hidden}/pytest.ini", "--rootdir", hidden]
        args.append(f"{hidden}/test_fleet_hidden.py")
        paths = ["/mnt/env", *source_paths]
        boot = f"import sys; sys.path[:0] = {paths!r}; import pytest; sys.exit(pytest.main({args!r}))"
        argv = [sys.executable, "-I", "-B", "-c", boot]
        report["hidden"] = tests(
            argv,
            cwd,
            env,
            job["timeout_s"],
            f"{hidden}/report.xml",
            "the task's hidden tests",
            require_report=True,
        )
    report["job_s"] = round(time.monotonic() - started, 3)
    print(REPORT_MARK + json.dumps(report))


if __name__ == "__main__":
    main()
