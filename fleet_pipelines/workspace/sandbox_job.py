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

import ast
import configparser
import contextlib
import ctypes
import functools
import importlib
import json
import os
import random
import re
import resource
import select
import shlex
import shutil
import signal
import socket
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
OUTPUT_KEPT = 4 * 1024 * 1024  # bytes of a command's output kept, head and tail (`drain`)
# The plan's sample, across the boundary on the base, gets what the first job's bound (max(3 x the
# plain run, the plain run + 30 s)) leaves after the job's two plain runs, less SAMPLE_MARGIN_S for
# the rest of the job, and at least SAMPLE_MIN_S: what crossed by then is the plan's sample (a
# project whose tests cross slowly, as more-itertools' iterators, no longer makes a first job long).
SAMPLE_MIN_S = 5.0
SAMPLE_MARGIN_S = 10.0
NOT_FOUND = ("ERROR: not found: ", "ERROR: found no collectors for ")  # pytest's, for an id it runs not
MAX_NOT_FOUND_RETRIES = 4  # the plan's sample run again without the ids pytest did not find
SAMPLE_ROUNDS = 3  # draws of the plan's sample while fewer than its size cross (`crossing`)


def excerpt(text, limit=EXCERPT):
    if len(text) <= limit:
        return text
    return text[: limit // 3] + "\n...\n" + text[-(2 * limit) // 3 :]


# Plugins of the environment that change how tests run rather than what they check are loaded
# (their markers and fixtures stay: a project's conftest may mark `no_cover`, a test may take
# `worker_id`) with the options that turn that off: the judge runs each test once, in order, in
# processes of its own. pytest-randomly, which reorders and reseeds tests, is not loaded.
NEUTRAL_OPTIONS = {"pytest-cov": ["--no-cov"], "pytest-xdist": ["-n", "0"]}
NOT_LOADED = {"pytest-randomly"}
# Deprecations of the judge's pytest and of the plugin releases that install beside it (newer than
# a project's CI may have run) never fail a test, even under a project's `filterwarnings = error`:
# python-dateutil's generator parametrize (pytest 9's PytestRemovedIn10Warning), blinker's
# pytest-asyncio, whose pin was relaxed to a release for our pytest that warns at configuration.
PYTEST_DEPRECATIONS = ["-W", "ignore::pytest.PytestDeprecationWarning"]
# A test module that cannot be collected (a test dependency that did not install) fails alone:
# its tests are errors, and every other module still runs (plain pytest would run none).
COLLECTION = ["--continue-on-collection-errors"]


@functools.cache  # read once per job: every command's environment carries them
def pytest_options(env="/mnt/env"):
    """pytest's options for every run: `-p MODULE` for each plugin the dependency environment
    installs (its `pytest11` entry points), less NOT_LOADED, with NEUTRAL_OPTIONS,
    PYTEST_DEPRECATIONS and COLLECTION. Autoloading is off (a patch could add entry points); the
    environment is the base's declared dependencies, read-only, so its plugins load by name."""
    found, neutral = [], []
    for info in sorted(os.listdir(env)) if os.path.isdir(env) else []:
        points = os.path.join(env, info, "entry_points.txt")
        if not info.endswith(".dist-info") or not os.path.isfile(points):
            continue
        dist = re.sub(r"[-_.]+", "-", info.removesuffix(".dist-info").rsplit("-", 1)[0]).lower()
        parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
        parser.optionxform = str
        with contextlib.suppress(configparser.Error, OSError, UnicodeDecodeError):
            parser.read(points)
        if dist in NOT_LOADED or not parser.has_section("pytest11"):
            continue
        for value in parser["pytest11"].values():
            found += ["-p", value.split(":")[0].strip()]
        neutral += NEUTRAL_OPTIONS.get(dist, [])
    return [*found, *neutral, *PYTEST_DEPRECATIONS, *COLLECTION]


def environment(job):
    """The environment of every command: the dependency environment importable, the tools the
    host bound (`runs.SHELL_TOOLS`) on the PATH, pytest's options (`pytest_options`), nothing
    else."""
    return {
        "PATH": f"/work/.bin:{job['tool_dir']}:/usr/local/bin:/usr/bin:/bin",
        "HOME": WORK,
        "TMPDIR": WORK,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": os.environ["PYTHONHASHSEED"],  # as the job's own (init.run_script): stable ids
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # no plugin of the patch's (dist-info entry points)
        "PYTHONPATH": ":".join(p for p in ("/mnt/env",) if os.path.isdir(p)),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CEILING_DIRECTORIES": WORK,
        "PYTEST_ADDOPTS": shlex.join(pytest_options()),
    }


BOOT = "/work/.fleet/boot"

# The configuration's `addopts` less the options that no plugin of the run defines (pytest-cov's
# `--cov=pkg`, xdist's `-n auto`, with their value): pytest would refuse the whole run for them
# ("unrecognized arguments"), and plugins are loaded only by name here. Left out after the
# conftests are loaded (they may define options too), so that pytest's own parser decides; what
# was left out is said on stderr. The test command's own arguments are never touched.
# With FLEET_IMPORT_MODE=append (the in-process runs), pytest's `prepend` import mode (its
# default: test folders ahead of the standard library) becomes `append`; a configured
# `importlib` (no folder on sys.path at all) or `append` is kept.
ADDOPTS_PLUGIN = """
import os
import sys

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    wanted = os.environ.get("FLEET_IMPORT_MODE")
    if wanted and early_config.known_args_namespace.importmode == "prepend":
        early_config.known_args_namespace.importmode = wanted  # the conftests' imports
        args.append("--import-mode=" + wanted)  # the test modules'
    result = yield
    addopts = [str(a) for a in early_config.getini("addopts")]
    if addopts and args[: len(addopts)] == addopts:
        unknown = set(parser.parse_known_and_unknown_args(addopts)[1])
        kept, dropped, i = [], [], 0
        while i < len(addopts):
            word = addopts[i]
            if word in unknown and word.startswith("-"):
                takes = "=" not in word and i + 1 < len(addopts) and not addopts[i + 1].startswith("-")
                dropped += addopts[i : i + 1 + takes]
                i += 1 + takes
                continue
            kept.append(word)
            i += 1
        if dropped:
            args[: len(addopts)] = kept
            said = "fleet: addopts options no plugin of this run defines, left out: " + " ".join(dropped)
            print(said, file=sys.stderr)
    return result
"""


# A repository's own top-level `test` module (chardet 5.2.0's test.py) is what `import test` finds
# in its in-process runs, as where pytest puts its folder first: the standard library after it
# holds CPython's `test` package (kept for `test.support`, which zipp's tests import).
OWN_TEST_MODULE = """
import importlib.machinery


class _OwnTest:
    @staticmethod
    def find_spec(name, path=None, target=None):
        return importlib.machinery.PathFinder.find_spec(name, [{root!r}]) if name == "test" else None


sys.meta_path.insert(0, _OwnTest)
"""


def in_process_environment(job, cwd):
    """The environment of a command that runs the repository in process (the test command, as
    the baseline and the agents' run_tests tool run it): the repository importable after the
    standard library and the environment (a sitecustomize of ours appends it; PYTHONSAFEPATH:
    no working directory ahead of the standard library), never ahead of them, but for its own
    `test` module (`OWN_TEST_MODULE`); pytest with
    `ADDOPTS_PLUGIN` (`fleet_addopts`)."""
    os.makedirs(BOOT, exist_ok=True)
    with open(f"{BOOT}/sitecustomize.py", "w") as f:
        f.write(f"import sys\nsys.path.extend({[cwd, os.path.join(cwd, 'src')]!r})\n")
        if any(os.path.exists(os.path.join(cwd, own)) for own in ("test.py", "test/__init__.py")):
            f.write(OWN_TEST_MODULE.format(root=cwd))
    with open(f"{BOOT}/fleet_addopts.py", "w") as f:
        f.write(ADDOPTS_PLUGIN)
    env = environment(job)
    env["PYTHONPATH"] = ":".join([BOOT, *filter(None, [env["PYTHONPATH"]])])
    env["PYTHONSAFEPATH"] = "1"
    env["PYTEST_ADDOPTS"] += " -p fleet_addopts"
    return env


def own_address_space():
    """Where no cgroup holds the run, this program is held to an address space below its hard
    limit (the sandbox's `program_mb`): a process it starts takes the hard limit, which every
    process of the code under test may have."""
    resource.setrlimit(resource.RLIMIT_AS, (resource.getrlimit(resource.RLIMIT_AS)[1],) * 2)


def run(argv, cwd, env, timeout_s):
    """The exit code of a command (None: it timed out), its stdout then stderr (each kept as
    `drain` keeps output), and its wall."""
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=own_address_space,
        )
    except OSError as exc:
        return 127, f"cannot run {argv[0]}: {exc}", time.monotonic() - start
    with process:
        streams = [process.stdout.fileno(), process.stderr.fileno()]
        data, finished = drain(streams, timeout_s, bounded=streams)
        if not finished:
            process.kill()
        code = process.wait()
    out = b"".join(data[fd] for fd in streams).decode(errors="replace")
    return code if finished else None, out, time.monotonic() - start


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
    env["PYTEST_ADDOPTS"] += f" -p no:cacheprovider --junitxml={report_file}"
    env["FLEET_IMPORT_MODE"] = "append"
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


OUTCOMES_PLUGIN = """
import json

RANK = ("passed", "xpassed", "skipped", "xfailed", "failed")
seen = {}


def pytest_runtest_logreport(report):
    xfail = hasattr(report, "wasxfail")
    if report.failed:
        now = "failed"
    elif report.skipped:
        now = "xfailed" if xfail else "skipped"
    elif report.when == "call" and xfail:
        now = "xpassed"
    else:
        now = "passed"
    old = seen.get(report.nodeid, "passed")
    seen[report.nodeid] = max(old, now, key=RANK.index)  # subtests and phases roll up to their id


def pytest_sessionfinish(session):
    with open("/work/.fleet/outcomes.json", "w") as f:
        json.dump(seen, f)
"""


TRACE_PLUGIN = """
import json
import os
import re
import sys
import threading

import pytest

ROOT = "/work/repo/"
MAX_LINES = 10_000  # the report stays well under the sandbox's output cap
with open("/work/.fleet/trace_ids.json") as f:
    WANTED = set(json.load(f))
executed = {}  # test id -> file -> lines
current = {}
count = 0


def junit_id(nodeid):
    path, bracket, params = nodeid.partition("[")  # as pytest's junitxml names a test case
    names = path.split("::")
    names[0] = re.sub(r"\\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ("::".join([".".join(names[:-1]), names[-1]])).strip(":")


def line(frame, event, arg):
    global count
    if event == "line" and count < MAX_LINES:
        lines = current.setdefault(frame.f_code.co_filename, set())
        if frame.f_lineno not in lines:
            lines.add(frame.f_lineno)
            count += 1
    return line


def call(frame, event, arg):
    if frame.f_code.co_filename.startswith(ROOT):
        return line(frame, "line", arg)
    return None


def pytest_collection_modifyitems(session, config, items):
    dropped = [i for i in items if junit_id(i.nodeid) not in WANTED]
    items[:] = [i for i in items if junit_id(i.nodeid) in WANTED]
    config.hook.pytest_deselected(items=dropped)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global current
    current = executed.setdefault(junit_id(item.nodeid), {})
    threading.settrace(call)
    sys.settrace(call)
    try:
        yield
    finally:
        sys.settrace(None)
        threading.settrace(None)


def pytest_sessionfinish(session):
    found = {}
    for test, files in executed.items():
        found[test] = {os.path.relpath(p, ROOT): sorted(n) for p, n in files.items()}
    with open("/work/.fleet/executed.json", "w") as f:
        json.dump(found, f)
"""
MAX_TRACED = 10
MIN_TRACE_S = 5.0
WALL_MARGIN_S = 15.0  # the report must be out before the sandbox's wall limit


def trace_order(failing):
    """The failing tests to trace: at most MAX_TRACED, at most two of each test function (its
    parameters stripped) before any third, so that one parametrised failure cannot fill them."""
    counts, first, rest = {}, [], []
    for test_id in failing:
        key = test_id.split("[", 1)[0]
        counts[key] = counts.get(key, 0) + 1
        (first if counts[key] <= 2 else rest).append(test_id)
    return (first + rest)[:MAX_TRACED]


def traced(job, cwd, failing, left_s):
    """The lines of the repository the failing tests (`trace_order`, junit ids) execute, run
    again alone with the test command's pytest arguments and a tracing plugin of ours (sys.settrace,
    only frames of files under the copy), within `left_s`: {path relative to the repository: [line
    numbers]} per test id; empty when it did not finish."""
    timeout_s = min(job["timeout_s"], left_s - WALL_MARGIN_S)
    if timeout_s < MIN_TRACE_S:
        return {}
    os.makedirs("/work/.fleet/trace", exist_ok=True)
    with open("/work/.fleet/trace/fleet_trace.py", "w") as f:
        f.write(TRACE_PLUGIN)
    with open("/work/.fleet/trace_ids.json", "w") as f:
        json.dump(trace_order(failing), f)
    env = in_process_environment(job, cwd)
    env["PYTHONPATH"] = f"/work/.fleet/trace:{env['PYTHONPATH']}"
    env["PYTEST_ADDOPTS"] += " -p no:cacheprovider -p fleet_trace"
    env["FLEET_IMPORT_MODE"] = "append"
    run(["python", "-m", "pytest", *job["trace_args"]], cwd, env, timeout_s)
    with contextlib.suppress(OSError, ValueError), open("/work/.fleet/executed.json") as f:
        found = json.load(f)
        if isinstance(found, dict):
            return found
    return {}


class Zygote:
    """pytest imported once, in a fork of this program made before it reads its job (so neither
    it nor any fork of it holds the hidden tests or the sample): each plain run is a fork of it,
    which runs pytest on the copy as plain pytest does, in process. The zygote, not this program,
    is that run's parent: what the code under test does to its parent (SIGSTOP, a kill) stops
    the zygote, and the run times out."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                own_address_space()
                ours.close()
                zygote_serve(theirs)
            finally:
                os._exit(70)
        theirs.close()
        self.sock = ours
        SPARED.add(self.pid)

    def run(self, request, timeout_s):
        """The exit status of one plain run (None: it timed out, or the zygote is gone)."""
        if self.pid not in SPARED:
            return None
        try:
            self.sock.sendall((json.dumps(request) + "\n").encode())
            self.sock.settimeout(timeout_s + 5)
            reply = self.sock.makefile("rb").readline()
            return json.loads(reply)["exit"]
        except (OSError, ValueError, KeyError):  # stopped or killed by the code under test
            SPARED.discard(self.pid)
            return None


def preload_pytest():
    """pytest and its built-in plugins from the environment, imported once before anything
    forks: the zygote's plain runs and the boundary's test processes start with them."""
    if not os.path.isdir("/mnt/env"):
        return
    sys.path.append("/mnt/env")
    try:
        with contextlib.suppress(ImportError):
            import _pytest.config
            import pytest  # noqa: F401

            for name in _pytest.config.default_plugins:
                with contextlib.suppress(ImportError):
                    importlib.import_module(f"_pytest.{name}")
    finally:
        sys.path.remove("/mnt/env")


def zygote_serve(sock):
    lines = sock.makefile("rb")
    for line in lines:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                plain_child(**request)
            finally:
                os._exit(70)
        deadline = time.monotonic() + request["timeout_s"]
        code = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.005)
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        sock.sendall((json.dumps({"exit": code}) + "\n").encode())


def plain_child(args, cwd, env, path, out, timeout_s):
    """The plain run: pytest as `python -m pytest ARGS` runs it in `cwd` with `env` (the
    repository after the standard library and the environment), our outcomes plugin added."""
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again, as an exec'd pytest would be
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = path
    sys.argv = ["pytest", *args]
    importlib.invalidate_caches()
    os.chdir(cwd)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = open(1, "w", closefd=False)  # noqa: SIM115 (never returns)
    plugin = types.ModuleType("fleet_outcomes")
    exec(compile(OUTCOMES_PLUGIN, "fleet_outcomes.py", "exec"), plugin.__dict__)
    import pytest

    code = int(pytest.main(["-p", "no:cacheprovider", *args], plugins=[plugin]))
    sys.stdout.flush()
    os._exit(code)


def plain(state, job, args, ran):
    """pytest on the copy as plain pytest runs it, in process (full fidelity, forgeable: the code
    under test shares the process), each test id's outcome (subtests rolled up) read from a plugin
    of ours: {"outcomes": {id: passed|failed|skipped|xfailed|xpassed}, ...}."""
    state.fresh()
    shims(job)  # a test's subprocess: `python`, its CLI
    cwd = os.path.join(REPO, job.get("subdir", ""))
    env = in_process_environment(job, cwd)
    env_paths = [p for p in ("/mnt/env",) if os.path.isdir(p)]
    stdlib = [p for p in sys.path if p and p not in env_paths and not p.startswith(WORK)]
    request = {
        "args": args,
        "cwd": cwd,
        "env": env,
        "path": [BOOT, *env_paths, *stdlib, cwd, os.path.join(cwd, "src")],  # BOOT: fleet_addopts
        "out": "/work/.fleet/plain.out",
        "timeout_s": job["timeout_s"],
    }
    start = time.monotonic()
    code = state.zygote.run(request, job["timeout_s"])
    duration = time.monotonic() - start
    outcomes, out = {}, ""
    with contextlib.suppress(OSError, ValueError):
        with open("/work/.fleet/outcomes.json") as f:
            found = json.load(f)
        if isinstance(found, dict):
            outcomes = {str(k): str(v) for k, v in found.items()}
    with contextlib.suppress(OSError), open("/work/.fleet/plain.out", errors="replace") as f:
        out = f.read()
    return {
        "outcomes": outcomes,
        "ran": ran,
        "timeout": code is None,
        "exit": code,
        "output": excerpt(out),
        "duration_s": round(duration, 3),
    }


CONSOLE_SCRIPT = """#!{python}
import importlib
import sys

found = importlib.import_module({module!r})
for name in {attr!r}.split("."):
    found = getattr(found, name)
sys.exit(found())
"""


def shims(job):
    """`python`, `python3` and `pytest` on the commands' PATH, then the project's own console
    scripts (`job["console_scripts"]`: name -> `module:attr`, the base's, as `pip install -e .`
    would install them), which import the copy's code; none replaces a shim or a tool of the PATH."""
    python = sys.executable
    os.makedirs("/work/.bin", exist_ok=True)
    for name in ("python", "python3"):
        os.symlink(python, f"/work/.bin/{name}")
    with open("/work/.bin/pytest", "w") as f:
        f.write(f"#!{python}\nimport sys\nimport pytest\nsys.exit(pytest.main())\n")
    os.chmod("/work/.bin/pytest", 0o755)
    taken = set(os.listdir("/work/.bin"))
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        with contextlib.suppress(OSError):
            taken.update(os.listdir(folder))
    for name, target in job.get("console_scripts", {}).items():
        module, _, attr = target.partition(":")
        if "/" in name or name.startswith(".") or name in taken:
            continue
        with open(f"/work/.bin/{name}", "w") as f:
            f.write(CONSOLE_SCRIPT.format(python=python, module=module, attr=attr))
        os.chmod(f"/work/.bin/{name}", 0o755)


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


SPARED = set()  # the zygote: kept between commands (what it forks is not)


def kill_all():
    """Every other process of the sandbox (pid 1 and the zygote aside), then their exit statuses:
    we are the child subreaper, so whatever a command left behind is reparented here and reaped.
    A zygote that no longer reaps its own (stopped by the code under test) is ended too."""
    for attempt in range(200):
        others = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (1, os.getpid(), *SPARED):
                others.append(int(name))
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(name), signal.SIGKILL)
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not others:
            return
        if attempt > 100:  # what is left is the zygote's, unreaped: it goes too
            SPARED.clear()
        time.sleep(0.001)
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


def restore(path):
    """`path` of the copy as the base commit has it (removed when the base has none)."""
    target, base = (
        os.path.normpath(os.path.join(REPO, path)),
        os.path.normpath(os.path.join("/mnt/repo", path)),
    )
    if not target.startswith(REPO + "/"):
        return
    if os.path.lexists(target):
        wipe(target)
    if os.path.isfile(base) and not os.path.islink(base):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(base, target)


class Job:
    """The job's state: the patched copy as it must be before each command."""

    def __init__(self, job, patch, base_paths=(), zygote=None):
        self.job = job
        self.zygote = zygote
        self.patch = patch
        self.base_paths = list(base_paths)  # kept as the base has them whatever the patch did
        self.snapshot = None
        self.applies = True
        self.apply_output = ""
        self.changed = []

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
        if self.patch:  # an empty patch: the base as it is ("no change proposed")
            self.applies, self.apply_output = apply_patch(self.job["git"], self.patch, environment(self.job))
            self.changed = changed_paths("/mnt/repo", REPO)  # before the base's test side returns
        for path in self.base_paths:
            restore(path)
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


class Kept:
    """What a stream wrote; with `half`, only its first and last `half` bytes (what the code under
    test prints cannot fill this program's memory)."""

    def __init__(self, half=None):
        self.half, self.head, self.tail, self.left_out = half, bytearray(), bytearray(), 0

    def add(self, data):
        if self.half is None:
            self.head += data
            return
        room = max(0, self.half - len(self.head))
        self.head += data[:room]
        self.tail += data[room:]
        if len(self.tail) > self.half:
            cut = len(self.tail) - self.half
            self.left_out += cut
            del self.tail[:cut]

    def value(self):
        mark = b"\n... (%d bytes left out) ...\n" % self.left_out if self.left_out else b""
        return bytes(self.head) + mark + bytes(self.tail)


def drain(fds, timeout_s, bounded=()):
    """What was written to `fds` until each is closed or `timeout_s` passed (False: timed out);
    of those in `bounded`, the first and last OUTPUT_KEPT / 2 bytes."""
    kept = {fd: Kept(OUTPUT_KEPT // 2 if fd in bounded else None) for fd in fds}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    open_fds = set(fds)
    deadline = time.monotonic() + timeout_s
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return {fd: k.value() for fd, k in kept.items()}, False
        for fd, _event in poller.poll(left * 1000):
            data = os.read(fd, 65536)
            if data:
                kept[fd].add(data)
            else:
                poller.unregister(fd)
                open_fds.discard(fd)
    return {fd: k.value() for fd, k in kept.items()}, True


def doctest_options(args):
    """The test command's doctest options: test ids run again need them (a doctest's id is not
    found without them, and pytest then runs none of the ids)."""
    return [a for a in args or () if a.startswith("--doctest")]


def hidden_sessions(state, boundary, job):
    """The hidden tests across the boundary, each test function in a session of its own (a fresh
    state: what the code wrote to files, /dev/shm or its own copy for one test is gone before the
    next, as its process is), merged into one session's report; all within one `timeout_s`."""
    ids = job.get("hidden_ids") or [None]
    deadline = time.monotonic() + job["timeout_s"]
    merged = {"results": {}, "collected": [], "collect_errors": [], "done": True, "timeout": False}
    outputs, took = [], 0.0
    for test_id in ids:
        left = deadline - time.monotonic()
        if left <= 0:
            merged["timeout"] = True
            break
        one = session(
            state,
            boundary,
            job,
            args=[test_id] if test_id else None,
            hidden=job["hidden_tests"],
            timeout_s=left,
        )
        merged["results"].update(one["results"])
        merged["collected"] += [i for i in one["collected"] if i not in merged["collected"]]
        merged["collect_errors"] += [e for e in one["collect_errors"] if e not in merged["collect_errors"]]
        merged["done"] = merged["done"] and one["done"]
        merged["timeout"] = merged["timeout"] or one["timeout"]
        if one.get("harness_error") and "harness_error" not in merged:
            merged["harness_error"] = one["harness_error"]
        merged["exit"] = max(merged.get("exit", 0), one.get("exit", 0))
        outputs.append(one["output"])
        took += one["duration_s"]
    merged.update(output=excerpt("\n".join(outputs)), duration_s=round(took, 3), not_found=[])
    return merged


def session(state, boundary, job, args=None, hidden=None, timeout_s=None):
    """One counted test session across the boundary (boundary.py), in a fresh state; its
    outcomes read from a pipe only the test process holds. `args`: test ids (run with the test
    command's doctest options), or with `hidden`, the hidden test functions to run."""
    state.fresh()
    cwd = os.path.join(REPO, job.get("subdir", ""))
    base = os.path.join("/mnt/repo", job.get("subdir", ""))
    ids = args or []  # with `hidden`, none: every hidden test
    if ids and not hidden:
        ids = [*doctest_options(job.get("visible_args")), *ids]
    spec = {
        "wire_path": "/fleet/init.py",
        "source": job["boundary_source"],
        "args": ids,
        "cwd": base,  # the base's tests, read-only: the patch cannot change them
        "code_cwd": cwd,  # the code under test runs in the patched copy
        "roots": [cwd, os.path.join(cwd, "src")],
        "base_roots": [base, os.path.join(base, "src")],
        "env_paths": [p for p in ("/mnt/env",) if os.path.isdir(p)],
        "env": {k: v for k, v in environment(job).items() if k != "PYTHONPATH"},
        "hidden_source": hidden,
        "plugin_source": ADDOPTS_PLUGIN,
    }
    start = time.monotonic()
    results_r, results_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the test process
        try:
            own_address_space()
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
    data, finished = drain(
        [results_r, out_r], job["timeout_s"] if timeout_s is None else timeout_s, bounded=[out_r]
    )
    os.close(results_r)
    os.close(out_r)
    kill_all()
    output = data[out_r].decode(errors="replace")
    report = {
        "results": {},
        "collected": [],
        "collect_errors": [],
        "done": False,
        "timeout": not finished,
        "output": excerpt(output),
        "duration_s": round(time.monotonic() - start, 3),
        # ids pytest did not find (it then runs none): a doctest of a name the base's source does
        # not bind, a test of a module that cannot be collected across the boundary (its class
        # derives from one of the code). Read from output the code under test can write to:
        # trusted only on the base
        "not_found": [
            line.removeprefix(prefix + base).lstrip("/")
            for line in output.splitlines()
            for prefix in NOT_FOUND
            if line.startswith(prefix)
        ],
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


def crossing(state, boundary, job, sample, rest, size, budget):
    """The plan's sample across the boundary on the base (no patch yet: its output is trusted):
    the ids pytest did not find are left out and the rest run again; while fewer than `size`
    passed across it, twice as many as are missing are drawn from `rest` (in their drawn order)
    and run, at most SAMPLE_ROUNDS times, all within `budget` seconds. One session's report, its
    results those of every round."""
    deadline = time.monotonic() + budget
    sampled = None
    for _ in range(SAMPLE_ROUNDS):
        report = session(state, boundary, job, args=sample, timeout_s=deadline - time.monotonic())
        for _ in range(MAX_NOT_FOUND_RETRIES):
            gone = set(report["not_found"])  # pytest names a parametrized one without its [...]
            found = [i for i in sample if i not in gone and i.partition("[")[0] not in gone]
            if found == sample or not found or report["results"]:
                break
            sample = found
            report = session(state, boundary, job, args=sample, timeout_s=deadline - time.monotonic())
        if sampled is None:
            sampled = report
        else:
            sampled["results"].update(report["results"])
            sampled["duration_s"] = round(sampled["duration_s"] + report["duration_s"], 3)
            sampled["timeout"] = report["timeout"]
        missing = size - sum(r["outcome"] == "passed" for r in sampled["results"].values())
        if missing <= 0 or not rest or report["timeout"] or deadline - time.monotonic() < 1:
            break
        sample, rest = rest[: 2 * missing], rest[2 * missing :]
    return sampled


def load_boundary(source):
    """boundary.py as a module, with pytest and its built-in plugins imported here from the
    environment, before any code under test runs: each test process (a fork) starts with them,
    and with the code process's program compiled (`code_side`)."""
    module = types.ModuleType("fleet_boundary")
    exec(compile(source, "boundary.py", "exec"), module.__dict__)
    module.code_side(source)  # the code process's program, compiled once: the forks inherit it
    if os.path.isdir("/mnt/env"):
        sys.path.append("/mnt/env")
        # pytest imports the repository's own package (pluggy): no preload, each test process
        # tries again and says why it could not
        try:
            with contextlib.suppress(ImportError):
                module.preload()
        finally:
            sys.path.remove("/mnt/env")
    return module


def named_ids(passing, hidden_source, limit):
    """Of the base's passing tests, those named after what the hidden tests import from the code
    (`from pkg import ordinal`, or `import pkg` and `pkg.ordinal(...)`: `test_ordinal[13-13th]`,
    `...strutils.camel2under` as a doctest), at most `limit`, those whose parameters or name hold
    a constant of the hidden tests first (`'13'`: `[13-13th]`; `'plurals'`:
    `test_pluralize_plurals`): the plan samples them besides its
    random draw, so that code which answers one way in a pytest process and another across the
    boundary (where the hidden tests run) is caught by the project's own tests of the same calls."""
    try:
        tree = ast.parse(hidden_source or "")
    except SyntaxError:
        return []
    names = {
        alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 0
        for alias in node.names
        if alias.name != "*" and len(alias.name) > 1
    }
    modules = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.Import)
        for alias in node.names
        if (alias.asname or "." not in alias.name)
        and alias.name.split(".")[0] not in (*sys.stdlib_module_names, "pytest")
    }
    names |= {  # `import inflection` ... `inflection.pluralize(...)`
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and len(node.attr) > 1
    }
    if not names:
        return []
    constants = {
        str(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str | int | float) and str(n.value)
    }
    word = re.compile("(?:^|_)(?:" + "|".join(re.escape(n) for n in sorted(names)) + ")(?:_|$)")
    found = []
    for test_id in passing:
        name = test_id.partition("[")[0]
        if any(word.search(part) for part in re.split(r"[^A-Za-z0-9_]", name.rsplit("/", 1)[-1])):
            found.append(test_id)

    def holds_a_constant(test_id):  # in its parameters, or as a word of its name
        name, _, params = test_id.partition("[")
        words = set(re.split(r"[^A-Za-z0-9]+|_", name.rsplit("/", 1)[-1]))
        words |= set(params.rstrip("]").split("-"))
        return bool(constants & words)

    found.sort(key=lambda i: not holds_a_constant(i))
    return found[:limit]


def main():
    libc = ctypes.CDLL(None)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no child opens our stdout via /proc
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: what a command leaves behind is ours to end
    zygote = None
    if os.path.exists("zygote"):  # the job runs plain pytest (a tool's job does not)
        os.unlink("zygote")
        preload_pytest()
        zygote = Zygote()  # before the job is read: no fork of it holds the hidden tests
    with open("job.json") as f:
        job = json.load(f)
    os.unlink("job.json")  # the hidden tests are in our memory only
    started = time.monotonic()
    boundary = load_boundary(job["boundary_source"]) if "boundary_source" in job else None
    report = {}
    args = job.get("visible_args")  # the test command's pytest arguments; None: not pytest
    if job.get("plan"):  # the base commit's sessions first: what counts, before the patch
        state = Job(job, None, zygote=zygote)
        state.build()
        if args is not None:
            report["plan_plain"] = base = plain(state, job, args, "plain pytest on the base commit")
            passing = sorted(i for i, o in base["outcomes"].items() if o == "passed")
            size = min(int(job.get("sample_size", 0)), len(passing))
            named = named_ids(passing, job.get("hidden_tests"), int(job.get("named_size", 0)))
            report["plan_named"] = named
            order = random.Random(job.get("seed", 0)).sample(passing, len(passing))
            sample = list(dict.fromkeys([*named, *order[:size]]))
            if sample:  # which of them the boundary can judge: re-run across it after the patch
                took = base["duration_s"]
                budget = min(job["timeout_s"], max(SAMPLE_MIN_S, max(took, 30 - took) - SAMPLE_MARGIN_S))
                report["plan_sample"] = crossing(state, boundary, job, sample, order[size:], size, budget)
        if job.get("hidden_tests"):
            report["plan_hidden"] = hidden_sessions(state, boundary, job)
        if job.get("patch") is None:
            kill_all()
            print(REPORT_MARK + json.dumps(report))
            return
    state = Job(job, job.get("patch"), job.get("base_paths", ()), zygote)
    state.build()
    cwd = os.path.join(REPO, job.get("subdir", ""))
    if job.get("patch") is not None:
        report.update(applies=state.applies, apply_output=state.apply_output)
        if not state.applies:
            print(REPORT_MARK + json.dumps(report))
            return
        report["changed"] = state.changed
        report["pytest_config_changed"] = config_changes(state.changed)
        if report["pytest_config_changed"]:  # the base's configuration judges the patch
            state.base_paths += report["pytest_config_changed"]
            state.build()
    if job.get("tool"):
        try:
            report["tool_output"] = tool(job, cwd)
        except (ValueError, TypeError, OSError, re.error) as exc:  # the model's arguments
            report["tool_output"] = f"error: {exc}"
    if args is not None and job.get("patch") is not None:
        report["plain"] = after = plain(state, job, args, "plain pytest on the patched copy")
        ids = job.get("boundary_ids")
        if ids is None and "plan_plain" in report:  # the sample that crossed, the base's failures
            crossed = report.get("plan_sample", {}).get("results", {}).items()
            ids = [i for i, r in crossed if r["outcome"] == "passed"]
            failing = [i for i, o in report["plan_plain"]["outcomes"].items() if o == "failed"]
            ids += failing[: int(job.get("max_failing", 0))]
        if ids:
            report["visible"] = session(state, boundary, job, args=ids)
            results = report["visible"]["results"].items()
            against = [
                i for i, r in results if r["outcome"] != "passed" and after["outcomes"].get(i) == "passed"
            ]
            if against:  # each again, in a session of its own: what a session's order did is not it
                report["visible_again"] = again = {
                    i: session(state, boundary, job, args=[i]) for i in against[:3]
                }
                alone = [i for i, s in again.items() if s["results"].get(i, {}).get("outcome") != "passed"]
                if alone:  # and on the base, which the patch cannot touch: can the boundary judge it?
                    base_state = Job(job, None, zygote=zygote)
                    report["visible_base"] = {i: session(base_state, boundary, job, args=[i]) for i in alone}
        p2p = job.get("pass_to_pass")
        if p2p is None:
            p2p = [i for i, o in report.get("plan_plain", {}).get("outcomes", {}).items() if o == "passed"]
        regressed = [i for i in p2p if after["outcomes"].get(i) != "passed"]
        if regressed and not after["timeout"] and len(regressed) <= int(job.get("max_recheck", 0)):
            base_state = Job(
                job, None, zygote=zygote
            )  # the same tests on the base again: a flaky one is left out
            base_state.fresh()  # (as the patched run may have left /work: fresh() undoes that first)
            report["base_recheck"] = plain(
                base_state,
                job,
                [*doctest_options(args), *regressed],
                "plain pytest on the base commit, again",
            )
    elif job.get("test_command"):
        state.fresh()
        shims(job)
        report["tests"] = tests(
            shlex.split(job["test_command"]),
            cwd,
            in_process_environment(job, cwd),
            job["timeout_s"],
            "/work/.fleet/visible.xml",
            f"{job['test_command']} (in {job.get('subdir') or '.'})",
            require_report=bool(job.get("require_report")),
        )
        failing = report["tests"].get("failing")
        if job.get("trace_args") is not None and failing and report["tests"]["status"] == "failed":
            state.fresh()
            shims(job)
            report["executed"] = traced(job, cwd, failing, job["wall_s"] - (time.monotonic() - started))
    if job.get("ruff_changed") is not None:
        state.fresh()
        changed = report.get("changed", job["ruff_changed"])
        report["ruff_issues"], report["ruff_output"] = ruff(job, environment(job), changed)
    if job.get("hidden_tests"):
        report["hidden"] = hidden_sessions(state, boundary, job)
    kill_all()
    report["job_s"] = round(time.monotonic() - started, 3)
    print(REPORT_MARK + json.dumps(report))


if __name__ == "__main__":
    main()
