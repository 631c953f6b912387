"""A hostile repository changes nothing outside its sandbox: hooks and filters never run (neither
the repository's nor the host's git configuration), submodules are not followed unless asked,
symlinks cannot reach outside the workspace, files and repositories have size caps, and a test
command that forks or hangs is bounded like any sandboxed run. Real git, real sandbox."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_pipelines.domain.models import RepoSpec
from fleet_pipelines.evaluation.repo_suite import git_commit_all
from fleet_pipelines.sandbox import isolation_available
from fleet_pipelines.workspace.checkout import CheckoutError, CheckoutLimits, checkout, git_env
from fleet_pipelines.workspace.prepare import prepare_workspace
from fleet_pipelines.workspace.runs import RepoRunLimits, baseline, score_patch

needs_sandbox = pytest.mark.skipif(not isolation_available()[0], reason="needs the bubblewrap sandbox")
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "PATH": os.environ["PATH"]}


def make_repo(path: Path, files: dict[str, str | bytes]) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(path)], check=True, env=GIT_ENV)
    for name, body in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(body if isinstance(body, bytes) else body.encode())
    git_commit_all(path, "hostile")
    return path


@pytest.fixture
def root(traversable_dir: Path) -> Path:
    return traversable_dir


def test_hooks_and_filters_never_run_neither_the_repos_nor_the_hosts(tmp_path, root, monkeypatch):
    marker = tmp_path / "pwned"
    hook = f"#!/bin/sh\necho hook >> {marker}\n"
    source = make_repo(
        tmp_path / "src",
        {".gitattributes": "* filter=evil diff=evil\n", "a.py": "x = 1\n"},
    )
    for name in (
        "post-checkout",
        "pre-commit",
        "post-merge",
        "reference-transaction",
        "pre-push",
        "post-update",
    ):
        (source / ".git" / "hooks" / name).write_text(hook)
        (source / ".git" / "hooks" / name).chmod(0o755)
    evil_hooks = tmp_path / "evil-hooks"
    evil_hooks.mkdir()
    for name in ("post-checkout", "reference-transaction", "post-index-change"):
        (evil_hooks / name).write_text(hook)
        (evil_hooks / name).chmod(0o755)
    # the host's own git configuration, as an attacker with a foothold would set it: ignored
    host_config = tmp_path / "gitconfig"
    host_config.write_text(
        textwrap.dedent(f"""
        [core]
            hooksPath = {evil_hooks}
            fsmonitor = echo fsmonitor >> {marker}
        [filter "evil"]
            smudge = sh -c 'echo smudge >> {marker}; cat'
            clean = sh -c 'echo clean >> {marker}; cat'
            required = true
        """)
    )
    subprocess.run(
        ["git", "-C", str(source), "config", "filter.evil.smudge", f"echo repo >> {marker}"], check=True
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(host_config))
    done = checkout(str(source), "main", root / "ws")
    assert not marker.exists(), marker.read_text()
    assert (root / "ws" / "a.py").read_text() == "x = 1\n"  # raw bytes: no smudge filter
    assert (root / "ws" / ".gitattributes").exists() and not (root / "ws" / ".git").exists()
    assert len(done.commit) == 40
    env = git_env(str(tmp_path))
    assert env["GIT_CONFIG_GLOBAL"] == os.devnull and env["GIT_CONFIG_NOSYSTEM"] == "1"


def test_symlinks_cannot_reach_outside_the_workspace(tmp_path, root):
    source = make_repo(tmp_path / "src", {"calc.py": "x = 1\n"})
    for name, target in {
        "passwd": "/etc/passwd",
        "up": "../../../outside",
        "sub/deep": "../../x",
        "ok": "calc.py",
        "sub/ok": "../calc.py",
    }.items():
        (source / name).parent.mkdir(exist_ok=True)
        os.symlink(target, source / name)
    git_commit_all(source, "links")
    done = checkout(str(source), "main", root / "ws")
    ws = root / "ws"
    assert (
        not (ws / "passwd").is_symlink()
        and not (ws / "up").is_symlink()
        and not (ws / "sub/deep").is_symlink()
    )
    assert os.readlink(ws / "ok") == "calc.py" and (ws / "sub/ok").read_text() == "x = 1\n"
    assert sorted(s.split(":")[0] for s in done.skipped) == ["passwd", "sub/deep", "up"]


def test_submodules_are_followed_only_when_asked(tmp_path, root):
    inner = make_repo(tmp_path / "inner", {"lib.py": "VALUE = 42\n"})
    outer = make_repo(tmp_path / "outer", {"main.py": "import lib\n"})
    subprocess.run(
        [
            "git",
            "-C",
            str(outer),
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "--quiet",
            str(inner),
            "vendor",
        ],
        check=True,
        env={**GIT_ENV, "HOME": str(tmp_path)},
    )
    git_commit_all(outer, "submodule")
    plain = checkout(str(outer), "main", root / "plain")
    assert not (root / "plain" / "vendor" / "lib.py").exists()
    assert any(s.startswith("vendor: submodule") for s in plain.skipped)
    asked = checkout(str(outer), "main", root / "asked", submodules=True)
    assert (root / "asked" / "vendor" / "lib.py").read_text() == "VALUE = 42\n"
    assert "vendor/lib.py" in {f.path for f in asked.files}


def test_files_and_repositories_have_size_caps(tmp_path, root):
    source = make_repo(tmp_path / "src", {"small.py": "x = 1\n", "big.bin": b"\0" * 50_000})
    limits = CheckoutLimits(max_file_bytes=10_000, max_repo_bytes=1_000_000, max_files=10)
    done = checkout(str(source), "main", root / "a", limits)
    assert not (root / "a" / "big.bin").exists()
    assert done.skipped == ["big.bin: 50000 bytes, over max_file_bytes 10000"]
    with pytest.raises(CheckoutError, match="max_repo_bytes"):
        checkout(
            str(source), "main", root / "b", CheckoutLimits(max_file_bytes=100_000, max_repo_bytes=10_000)
        )
    with pytest.raises(CheckoutError, match="max_files"):
        checkout(str(source), "main", root / "c", CheckoutLimits(max_files=1))


def test_the_checkout_is_read_only_and_a_bad_ref_is_a_clear_error(tmp_path, root):
    source = make_repo(tmp_path / "src", {"a.py": "x = 1\n"})
    checkout(str(source), "main", root / "ws")
    assert not os.stat(root / "ws" / "a.py").st_mode & 0o222
    assert not os.stat(root / "ws").st_mode & 0o222
    with pytest.raises(CheckoutError, match="fetch failed"):
        checkout(str(source), "no-such-branch", root / "ws2")
    marker = tmp_path / "injected"
    with pytest.raises(CheckoutError, match="does not appear to be a git repository"):
        checkout(f"--upload-pack=touch {marker}", "main", root / "ws3")  # a path, never an option
    assert not marker.exists()


@needs_sandbox
@pytest.mark.parametrize(
    ("program", "status"),
    [
        ("import time\ntime.sleep(600)\n", "timeout"),  # hangs
        (
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            None,
        ),  # forks
    ],
)
def test_a_test_command_that_hangs_or_forks_is_bounded(tmp_path, root, program, status):
    source = make_repo(tmp_path / "src", {"evil.py": program})
    limits = RepoRunLimits(wall_s=20, cpu_s=10, memory_mb=512, max_processes=32, command_timeout_s=4)
    started = time.monotonic()
    ws = prepare_workspace(
        "hostile", RepoSpec(url=str(source), test_command="python evil.py"), root, run_limits=limits
    )
    assert time.monotonic() - started < 60
    assert ws.baseline is not None and ws.baseline.status != "passed"
    if status:
        assert ws.baseline.status == status
    again = baseline(ws, limits)  # the host is fine: the next run works the same
    assert again.status == ws.baseline.status


@needs_sandbox
def test_a_report_over_the_output_limit_is_said_so_never_a_patch_that_does_not_apply(tmp_path, root):
    # packaging 24.1's 7,779 test ids made a 2.6 MB report: cut at the old 400,000 characters,
    # the first patch of a real project read "does not apply: the run ended before its report"
    many = "import pytest\n\n\n@pytest.mark.parametrize('n', range(300))\ndef test_n(n):\n    assert n >= 0\n"
    source = make_repo(tmp_path / "src", {"a.py": "x = 1\n", "tests/test_a.py": many})
    ws = prepare_workspace("report", RepoSpec(url=str(source)), root)
    assert ws.baseline is not None and ws.baseline.passed == 300
    comment = "--- a/a.py\n+++ b/a.py\n@@ -1 +1,2 @@\n+# a comment\n x = 1\n"
    small = RepoRunLimits(max_output_chars=5_000)
    evidence = score_patch(ws, comment, limits=small)
    assert "the job's report was cut: its output passed max_output_chars (5,000)" in evidence.not_run
    assert score_patch(ws, comment).tests.passed == 300  # the default holds it


@needs_sandbox
def test_a_repositorys_own_test_module_is_not_shadowed_by_cpythons_test_package(tmp_path, root):
    """chardet 5.2.0's tests are its root `test.py`: the baseline imported the standard library's
    `test` package instead (kept in the sandbox for `test.support`) and read a collection error."""
    files = {"calc.py": "x = 1\n", "test.py": "from calc import x\n\n\ndef test_x():\n    assert x == 1\n"}
    source = make_repo(tmp_path / "src", files)
    ws = prepare_workspace("own-test", RepoSpec(url=str(source), test_command="pytest test.py"), root)
    assert ws.baseline is not None and (ws.baseline.status, ws.baseline.passed) == ("passed", 1), ws.baseline
    evidence = score_patch(ws, "--- a/calc.py\n+++ b/calc.py\n@@ -1 +1,2 @@\n+# a comment\n x = 1\n")
    assert evidence.tests is not None and (evidence.tests.status, evidence.tests.passed) == ("passed", 1)


@needs_sandbox
def test_a_suite_too_long_for_the_runs_limits_is_not_run_from_its_baseline(tmp_path, root):
    """chardet 5.2.0's suite takes 60 s here: every patch's job was killed at the 120 s wall limit of
    then and scored 0, honest patches too. The baseline's duration says so before any job runs."""
    slow = "import time\n\n\ndef test_slow():\n    time.sleep(3)\n"
    source = make_repo(tmp_path / "src", {"a.py": "x = 1\n", "tests/test_a.py": slow})
    ws = prepare_workspace("slow", RepoSpec(url=str(source)), root)
    assert ws.baseline is not None and ws.baseline.passed == 1 and ws.baseline.duration_s >= 3
    comment = "--- a/a.py\n+++ b/a.py\n@@ -1 +1,2 @@\n+# a comment\n x = 1\n"
    evidence = score_patch(ws, comment, limits=RepoRunLimits(wall_s=15))
    assert evidence.not_run.startswith(f"the repository's tests take {ws.baseline.duration_s:.0f} s")
    assert "runs them 2 times: over the run's wall-clock limit of 15 s" in evidence.not_run
    assert "raise the repos resource's runs.wall_s" in evidence.not_run
    evidence = score_patch(ws, comment, limits=RepoRunLimits(cpu_s=3))
    assert "too near the CPU limit of 3 s" in evidence.not_run
    assert score_patch(ws, comment).tests.passed == 1  # the default limits hold it


@needs_sandbox
def test_the_projects_console_scripts_run_the_patched_copy_in_a_tests_subprocess(tmp_path, root):
    """python-dotenv 1.0.1's CLI tests run `dotenv` in a subprocess, as `pip install -e .` puts it
    on a developer's PATH: not found in the sandbox, they failed on the base and were not judged.
    The base's declared scripts are written on the commands' PATH, importing the copy's code."""
    files = {
        "pyproject.toml": '[project]\nname = "greet"\nversion = "1"\n'
        '[project.scripts]\ngreet = "greet:main"\npython = "greet:main"\n',
        "greet.py": "def main():\n    print('hi')\n",
        "tests/test_cli.py": "import subprocess\n\n\ndef test_cli():\n"
        "    assert subprocess.run(['greet'], capture_output=True, text=True).stdout == 'hi\\n'\n\n\n"
        "def test_python_is_python():\n"
        "    ran = subprocess.run(['python', '-c', 'print(2)'], capture_output=True, text=True)\n"
        "    assert ran.stdout == '2\\n'\n",
    }
    source = make_repo(tmp_path / "src", files)
    ws = prepare_workspace("scripts", RepoSpec(url=str(source)), root)
    assert ws.baseline is not None and (ws.baseline.status, ws.baseline.passed) == ("passed", 2), ws.baseline
    bye = (
        "--- a/greet.py\n+++ b/greet.py\n@@ -1,2 +1,2 @@\n def main():\n-    print('hi')\n+    print('bye')\n"
    )
    evidence = score_patch(ws, bye)
    assert evidence.tests is not None and evidence.tests.failing == ["tests/test_cli.py::test_cli"], (
        evidence.tests
    )


@needs_sandbox
def test_a_patch_cannot_write_outside_the_sandboxed_copy(tmp_path, root):
    source = make_repo(
        tmp_path / "src",
        # code, not data only: a module only tests import that holds data is the tests' own
        {
            "a.py": "x = 1\nif x:\n    pass\n",
            "tests/test_a.py": "from a import x\n\n\ndef test_a():\n    assert x == 1\n",
        },
    )
    ws = prepare_workspace("escape", RepoSpec(url=str(source)), root)
    outside = tmp_path / "escaped.txt"
    escape = f"--- /dev/null\n+++ b/../../../../..{outside}\n@@ -0,0 +1 @@\n+escaped\n"
    evidence = score_patch(ws, escape)
    assert not evidence.applies and not outside.exists()
    body = [
        "import contextlib",
        "with contextlib.suppress(OSError):",
        f"    open({str(outside)!r}, 'w').write('x')",
        "open('/mnt/repo/a.py', 'w').write('y')",  # read-only: raises, the import fails
    ]
    added = "".join(f"+{line}\n" for line in body)
    writer = f"--- a/a.py\n+++ b/a.py\n@@ -1 +1,5 @@\n{added} x = 1\n"
    evidence = score_patch(ws, writer)
    assert evidence.applies and evidence.tests is not None and evidence.tests.status == "failed"
    assert "Read-only file system" in evidence.tests.first_failure
    assert not outside.exists()
    assert (Path(ws.path) / "a.py").read_text().startswith("x = 1\n")  # the workspace is read-only in there


@needs_sandbox
def test_declared_dependencies_are_installed_once_into_a_read_only_environment(tmp_path, root):
    """The repository's requirements.txt (six, from the package index: the one step with network)
    lands in the workspace's environment, which every sandboxed run mounts read-only."""
    test = "import six\n\nfrom uses import py3\n\n\ndef test_six():\n    assert six.PY3 and py3()\n"
    files = {
        "requirements.txt": "six\n",
        "tests/test_six.py": test,
        "uses.py": "import six\n\n\ndef py3():\n    return six.PY3\n",
    }
    source = make_repo(tmp_path / "src", files)
    ws = prepare_workspace("deps", RepoSpec(url=str(source)), root)
    assert ws.dependencies == ["six"]
    assert ws.baseline is not None and ws.baseline.status == "passed" and ws.baseline.passed == 1
    env = Path(ws.env_path)
    assert (env / "six.py").exists() and (env / "pytest").is_dir()  # the test runner, copied from here
    assert not os.stat(env / "six.py").st_mode & 0o222
    fine = score_patch(ws, diff("notes.txt", None, "x\n"))  # the code under test imports six too
    assert fine.tests is not None and (fine.tests.status, fine.tests.passed) == ("passed", 1), fine.tests
    again = prepare_workspace("deps", RepoSpec(url=str(source)), root)  # same commit: built once
    assert (
        again.env_path == ws.env_path
        and os.stat(env / "six.py").st_mtime_ns == os.stat(Path(again.env_path) / "six.py").st_mtime_ns
    )


@needs_sandbox
def test_a_patch_that_forges_the_repositorys_own_tests_still_fails_them(tmp_path, root):
    """A conftest.py, a sitecustomize.py and a pytest.py that exit 0 (they ended the repository's
    test command with status 0 once): none of them is the base commit's, so none runs where the
    tests are counted (the base's configuration, no site, the standard library and the
    environment ahead of the repository, the base's conftest.py files put back in the plain run);
    the base's failing test is not counted (SWE-bench's rule), the hidden test fails on the
    unfixed bug and the patch is flagged for touching what judges it."""
    source = make_repo(
        tmp_path / "src",
        {
            "calc.py": "def add(a, b):\n    return a - b\n",
            "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
        },
    )
    ws = prepare_workspace("forge", RepoSpec(url=str(source)), root)
    forge = "".join(
        f"--- /dev/null\n+++ b/{name}\n@@ -0,0 +1,2 @@\n+import os\n+os._exit(0)\n"
        for name in ("conftest.py", "sitecustomize.py", "pytest.py")
    )
    hidden = "from calc import add\n\n\ndef test_add_hidden():\n    assert add(1, 1) == 2\n"
    evidence = score_patch(ws, forge, hidden)
    assert evidence.applies and evidence.tests is not None and evidence.tests.total == 0
    assert evidence.tests.not_counted == 1 and evidence.tests.base_failing_passed == 0
    assert evidence.hidden is not None and evidence.hidden.status == "failed"
    assert (evidence.hidden.passed, evidence.hidden.failed) == (0, 1)
    assert [f.split(":")[0] for f in evidence.flags] == ["conftest.py", "pytest.py", "sitecustomize.py"]


@needs_sandbox
def test_code_under_test_that_exits_0_on_import_passes_no_tests(tmp_path, root):
    """The patched module ends its process with status 0 as the tests import it: that process is
    the code process, not the tests', so every counted test fails (the tests check was 1.0 when
    the exit status said "passed")."""
    from fleet_pipelines.domain.models import Task
    from fleet_pipelines.scoring.patch import patch_checks

    source = make_repo(
        tmp_path / "src",
        {
            "calc.py": "def add(a, b):\n    return a - b\n",
            "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
        },
    )
    ws = prepare_workspace("exit0", RepoSpec(url=str(source)), root)
    exit0 = (
        "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,4 @@\n+import os\n+os._exit(0)\n"
        " def add(a, b):\n     return a - b\n"
    )
    hidden = "from calc import add\n\n\ndef test_add_hidden():\n    assert add(1, 1) == 2\n"
    evidence = score_patch(ws, exit0, hidden)
    assert evidence.applies and evidence.tests is not None and evidence.hidden is not None
    assert evidence.hidden.status == "failed" and evidence.tests.total == 0  # the base's failing: not counted
    assert evidence.tests.base_failing_passed == evidence.hidden.passed == 0
    assert "the code under test is gone: exit code 0" in evidence.hidden.first_failure
    task = Task.from_fields("exit0", {"description": "Fix add.", "role": "DEV", "tests": hidden})
    checks = {c.name: c for c in patch_checks(ws, task, f"```diff\n{exit0}```", RepoRunLimits())}
    assert checks["patch_applies"].value == 1.0 and checks["tests"].value == 0.0


@needs_sandbox
def test_a_test_that_needs_an_object_of_the_code_is_judged_as_plain_pytest_judges_it(tmp_path, root):
    """A pass-to-pass test runs as plain pytest (a forged report there could only hide a
    regression), so the test that needs an instance is judged like any other; the base's failing
    test is not counted, and it crosses the boundary (plain values and the repository's exception
    classes by value, an instance as a handle: test_code_objects.py): the fix makes it pass there."""
    from fleet_pipelines.domain.models import Task
    from fleet_pipelines.scoring.patch import patch_checks

    calc = textwrap.dedent(
        """
        class ParseError(ValueError):
            pass


        def parse(text):
            if not text.isdigit():
                raise ParseError(text)
            return int(text) + 1


        class Counter:
            def __init__(self):
                self.n = 0

            def bump(self):
                self.n += 1
                return self.n
        """
    )
    tests = textwrap.dedent(
        """
        import pytest

        from calc import Counter, ParseError, parse


        def test_parse():
            assert parse("4") == 4


        def test_parse_rejects():
            with pytest.raises(ParseError, match="x"):
                parse("x")


        def test_counter():
            assert Counter().bump() == 1
        """
    )
    source = make_repo(tmp_path / "src", {"calc.py": calc, "tests/test_calc.py": tests})
    ws = prepare_workspace("objects", RepoSpec(url=str(source)), root)
    fix = diff("calc.py", calc, calc.replace("int(text) + 1", "int(text)"))
    task = Task.from_fields("objects", {"description": "Fix parse.", "role": "DEV"})
    checks = {c.name: c for c in patch_checks(ws, task, f"```diff\n{fix}```", RepoRunLimits())}
    assert checks["tests"].value == 1.0, checks["tests"]
    assert "2 pass-to-pass in plain pytest" in checks["tests"].evidence
    evidence = score_patch(ws, fix)
    assert evidence.tests is not None and (evidence.tests.passed, evidence.tests.failed) == (2, 0)
    assert (evidence.tests.base_failing, evidence.tests.base_failing_passed) == (1, 1)
    breaks = diff("calc.py", calc, calc.replace("self.n += 1", "self.n += 2"))
    evidence = score_patch(ws, breaks)
    assert evidence.tests is not None and evidence.tests.failing == ["tests/test_calc.py::test_counter"]


@needs_sandbox
def test_a_repositorys_tests_can_shell_out_import_tkinter_and_load_a_cpp_runtime_as_on_the_host(
    tmp_path, root
):
    """Real suites do all three (six's `test_getoutput` and its `tkinter` moves, toml's numpy
    tests failed in the sandbox only; click edits with `sed` and pages with `cat`): the sandbox
    has the host's `sh` at /bin/sh and the standard utilities on the PATH, the standard library
    with tkinter (also where a root caller runs it from a copy), and the C++ runtime manylinux
    wheels link against."""
    files = {
        "tests/test_shell.py": (
            "import os\nimport subprocess\n\n\ndef test_shell():\n"
            "    assert subprocess.getoutput('echo $((6 * 7))') == '42'\n"
            "    assert os.system('exit 3') >> 8 == 3\n"
            "    piped = \"printf 'b\\\\na\\\\n' | sort | sed s/a/A/ | cat\"\n"
            "    assert subprocess.getoutput(piped) == 'A\\nb'\n"
        ),
        "tests/test_cpp.py": "import ctypes\n\n\ndef test_cpp():\n    ctypes.CDLL('libstdc++.so.6')\n",
    }
    try:  # where this interpreter has tkinter, the sandbox's has it too
        import tkinter  # noqa: F401

        files["tests/test_tk.py"] = "import tkinter\n\n\ndef test_tk():\n    assert tkinter.TkVersion >= 8\n"
    except ImportError:
        pass
    ws = prepare_workspace("shell", RepoSpec(url=str(make_repo(tmp_path / "src", files))), root)
    assert ws.baseline is not None and ws.baseline.status == "passed", ws.baseline
    assert (ws.baseline.passed, ws.baseline.failed) == (len(files), 0)


@needs_sandbox
def test_hidden_tests_of_a_name_the_base_lacks_still_count(tmp_path, root):
    """A task that asks for a new function: on the base commit its hidden tests cannot even be
    collected, so what counts is read from their source. The patch that adds it passes them; one
    that adds nothing fails them (they never report): they never drop out of the count."""
    source = make_repo(tmp_path / "src", {"calc.py": CALC, "tests/test_calc.py": VISIBLE.replace("5", "-1")})
    ws = prepare_workspace("feature", RepoSpec(url=str(source)), root)
    hidden = "from calc import sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
    adds = diff("calc.py", CALC, CALC + "\n\ndef sub(a, b):\n    return a - b\n")
    evidence = score_patch(ws, adds, hidden)
    assert evidence.hidden is not None and (evidence.hidden.passed, evidence.hidden.failed) == (1, 0)
    assert evidence.tests is not None and evidence.tests.status == "passed"
    nothing = diff("calc.py", CALC, CALC.replace("Tiny", "Small"))
    evidence = score_patch(ws, nothing, hidden)
    assert evidence.hidden is not None and (evidence.hidden.passed, evidence.hidden.failed) == (0, 1)
    assert "test_fleet_hidden.py::test_sub: not reported" in evidence.hidden.first_failure


@needs_sandbox
def test_a_package_that_holds_its_own_tests_is_judged_across_the_boundary(tmp_path, root):
    """Tests inside the package (`mypkg/tests/test_core.py`, a conftest.py in it) are the base
    commit's files, imported by the test process; the package's code stays behind the boundary."""
    core = "def double(x):\n    return x + x + 1\n"
    files = {
        "mypkg/__init__.py": "",
        "mypkg/core.py": core,
        "mypkg/conftest.py": "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n",
        "mypkg/tests/__init__.py": "",
        "mypkg/tests/helpers.py": "FOUR = 4\n",
        "mypkg/tests/test_core.py": (
            "from mypkg.core import double\n\nfrom .helpers import FOUR\n\n\n"
            "def test_double(two):\n    assert double(two) == FOUR\n\n\n"
            "def test_zero():\n    assert double(0) == 0\n"
        ),
    }
    source = make_repo(tmp_path / "src", files)
    ws = prepare_workspace("package", RepoSpec(url=str(source)), root)
    assert ws.baseline is not None and (ws.baseline.passed, ws.baseline.failed) == (0, 2)
    fixed = score_patch(ws, diff("mypkg/core.py", core, core.replace(" + 1", "")))
    assert fixed.tests is not None and fixed.tests.total == 0, fixed.tests  # failing on the base
    assert (fixed.tests.base_failing, fixed.tests.base_failing_passed) == (2, 2), fixed.tests


def test_retention_removes_a_tasks_read_only_workspaces(tmp_path, root):
    from fleet_pipelines.resources.history import HistoryResource

    source = make_repo(tmp_path / "src", {"a.py": "x = 1\n"})
    checkout(str(source), "main", root / "gone-1" / "abc" / "repo")  # read-only, as prepare leaves it
    history = HistoryResource(base_path=str(tmp_path), max_age_seconds=1, workspaces_dir=str(root))
    assert history.remove_workspace("gone-1") and not (root / "gone-1").exists()
    assert not history.remove_workspace("gone-1") and not history.remove_workspace("never")


# --- forged verdicts: patches that try to write their own score ---
#
# A small repository (calc.py with a bug in `add`; one visible test failing on it, one passing; two
# hidden tests on `add`). Each forgery leaves `add` wrong and tries to pass anyway; each must score
# no higher on the tests check, and get no better verdict or selector key, than the honest wrong
# patch, in every identity of the sandbox suite (tests/integration/sandbox_identities.py). The
# honest fix scores 1.

CALC = '"""Tiny arithmetic."""\n\n\ndef add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n'
VISIBLE = (
    "from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n"
)
HIDDEN = (
    "from calc import add\n\n\ndef test_add_negative():\n    assert add(-2, -3) == -5\n\n\n"
    "def test_add_order():\n    assert add(4, 1) == 5\n"
)
_HOSTILE_DRIVER = textwrap.dedent(
    """
    import dataclasses, json, sys
    from fleet_pipelines.domain.limits import SandboxLimits
    from fleet_pipelines.sandbox import run as sandbox

    fields = {f.name for f in dataclasses.fields(SandboxLimits)}
    print(json.dumps(sandbox.isolation_available()), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        limits = SandboxLimits(**{k: v for k, v in req["limits"].items() if k in fields})
        result = sandbox.run_python(
            req["source"], limits, req["files"], req["mounts"], tuple(req["tools"]), req["program_mb"]
        )
        print(json.dumps(dataclasses.asdict(result)), flush=True)
    """
)


def diff(path: str, old: str | None, new: str | None) -> str:
    """A unified diff (git apply's format) turning `old` into `new` at `path` (None: no file)."""
    import difflib

    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True),
        (new or "").splitlines(keepends=True),
        "/dev/null" if old is None else f"a/{path}",
        "/dev/null" if new is None else f"b/{path}",
    )
    return "".join(lines)


def calc_with(prelude: str = "", body: str = "    return a - b\n") -> str:
    """calc.py with `prelude` at the top and `add`'s body replaced (still wrong unless told)."""
    return CALC.replace("    return a - b\n", body).replace(
        '"""Tiny arithmetic."""\n', f'"""Tiny arithmetic."""\n{prelude}'
    )


ATEXIT = """
import atexit, glob, os, re, sys


def _forge():
    for path in glob.glob("/work/**/*.xml", recursive=True, include_hidden=True):
        text = re.sub(r"<(failure|error)\\b.*?</(failure|error)>", "", open(path).read(), flags=re.S)
        open(path, "w").write(re.sub(r'(failures|errors)="\\d+"', r'\\1="0"', text))
    sys.stdout.write("FLEET-JOB-REPORT {}\\n")
    os._exit(0)


atexit.register(_forge)
"""
STACK_BODY = """    import inspect, re

    for frame in inspect.stack():
        for line in frame.code_context or ():
            found = re.search(r"add\\((.*?)\\)\\s*==\\s*(-?\\d+)", line)
            if found:
                return int(found.group(2))
    return a - b
"""
WRAP_REPORT = """
try:
    from _pytest import reports as _reports

    _original = _reports.TestReport.from_item_and_call.__func__

    def _forged(cls, item, call):
        report = _original(cls, item, call)
        report.outcome, report.longrepr = "passed", None
        return report

    _reports.TestReport.from_item_and_call = classmethod(_forged)
except ImportError:
    pass
"""
PLUGIN = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome, report.longrepr = "passed", None


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.skip(reason="forged"))
"""
PPRINT = (  # the real pprint's names, and TestReport wrapped as soon as pytest imports it
    "import importlib.machinery, importlib.util, sys, sysconfig\n"
    "_path = sysconfig.get_paths()['stdlib'] + '/pprint.py'\n"
    "_spec = importlib.util.spec_from_file_location('_real_pprint', _path)\n"
    "_real = importlib.util.module_from_spec(_spec)\n_spec.loader.exec_module(_real)\n"
    "globals().update({k: v for k, v in vars(_real).items() if not k.startswith('__')})\n"
    + textwrap.dedent(
        """
        def _wrap(reports):
            original = reports.TestReport.from_item_and_call.__func__

            def forged(cls, item, call):
                report = original(cls, item, call)
                report.outcome, report.longrepr = "passed", None
                return report

            reports.TestReport.from_item_and_call = classmethod(forged)


        class _Hook:
            def find_spec(self, name, path=None, target=None):
                if name != "_pytest.reports":
                    return None
                sys.meta_path.remove(self)
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                run = spec.loader.exec_module

                def exec_module(module):
                    run(module)
                    _wrap(module)

                spec.loader.exec_module = exec_module
                return spec


        if "_pytest.reports" in sys.modules:
            _wrap(sys.modules["_pytest.reports"])
        else:
            sys.meta_path.insert(0, _Hook())
        """
    )
)
DAEMON = """
import os, sys, time

FIXED = open(__file__).read().replace("return a - b", "return a + b").split("# --fork--")[0]
if os.environ.get("FLEET_FORGED") is None and os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.environ["FLEET_FORGED"] = "1"
        for _ in range(600):
            for directory, _dirs, files in os.walk("/work"):
                for name in files:
                    path = os.path.join(directory, name)
                    try:
                        if name == "calc.py":
                            open(path, "w").write(FIXED)
                        elif name.startswith("test_") and name.endswith(".py"):
                            open(path, "w").write("def test_forged():\\n    pass\\n")
                        elif name.endswith(".xml"):
                            open(path, "w").write('<testsuite tests="1"><testcase name="x"/></testsuite>')
                    except OSError:
                        pass
            time.sleep(0.05)
    os._exit(0)
# --fork--
"""
LIAR = """

class _Always(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__
"""
SNOOP_BODY = """    import glob, re

    wanted = re.compile(r"add\\(\\s*" + re.escape(f"{a}, {b}") + r"\\s*\\)\\s*==\\s*(-?\\d+)")
    places = ("/proc/*/cmdline", "/proc/*/environ", "/work/**/*", "/mnt/**/*", "/tmp/**/*", "/dev/shm/*")
    for pattern in places:
        for path in glob.glob(pattern, recursive=True):
            try:
                found = wanted.search(open(path, errors="replace").read())
            except OSError:
                continue
            if found and "test_calc" not in path:
                return int(found.group(1))
    return a - b
"""
EVIL_INI = "[pytest]\naddopts = -p evilplug\n"
SITE = WRAP_REPORT.replace("try:", "import sys\ntry:")

FORGERIES: dict[str, str] = {
    # the (#29)
    "atexit rewrites the report, then _exit(0)": diff("calc.py", CALC, calc_with(ATEXIT)),
    "inspect.stack() reads the calling test": diff("calc.py", CALC, calc_with(body=STACK_BODY)),
    "wraps TestReport.from_item_and_call on import": diff("calc.py", CALC, calc_with(WRAP_REPORT)),
    "a dist-info entry point loads a pytest plugin": diff(
        "evilplug-1.0.dist-info/entry_points.txt", None, "[pytest11]\nevilplug = evilplug\n"
    )
    + diff("evilplug-1.0.dist-info/METADATA", None, "Metadata-Version: 2.1\nName: evilplug\nVersion: 1.0\n")
    + diff("evilplug.py", None, PLUGIN),
    "pprint.py at the root runs before pytest": diff("pprint.py", None, PPRINT),
    "module-level pytest.skip (when the hidden tests import it)": diff(
        "calc.py",
        CALC,
        calc_with(
            "import inspect\nimport pytest\n\n"
            "if any('hidden' in frame.filename for frame in inspect.stack()):\n"
            '    pytest.skip("not today", allow_module_level=True)\n'
        ),
    ),
    "the hidden skip, and the visible test rewritten to match the bug": diff(
        "calc.py",
        CALC,
        calc_with(
            "import inspect\nimport pytest\n\n"
            "if any('hidden' in frame.filename for frame in inspect.stack()):\n"
            '    pytest.skip("not today", allow_module_level=True)\n'
        ),
    )
    + diff("tests/test_calc.py", VISIBLE, VISIBLE.replace("add(2, 3) == 5", "add(2, 3) == -1")),
    "300 empty tests added": diff(
        "tests/test_many.py", None, "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(300))
    ),
    "the visible test edited to match the bug": diff(
        "tests/test_calc.py", VISIBLE, VISIBLE.replace("add(2, 3) == 5", "add(2, 3) == -1")
    ),
    "a background process rewrites files for the next command": diff("calc.py", CALC, calc_with(DAEMON)),
    # our own
    "an int that equals everything": diff("calc.py", CALC, calc_with(LIAR, "    return _Always(a - b)\n")),
    "reads the hidden tests wherever they might be": diff("calc.py", CALC, calc_with(body=SNOOP_BODY)),
    "conftest.py, pytest.ini and a plugin at the root": diff("conftest.py", None, PLUGIN)
    + diff("pytest.ini", None, EVIL_INI)
    + diff("evilplug.py", None, PLUGIN),
    "sitecustomize.py and a .pth file": diff("sitecustomize.py", None, SITE)
    + diff("fleet.pth", None, "import sitecustomize\n"),
    "kills every other process on import": diff(
        "calc.py", CALC, calc_with("import os, signal\nos.kill(-1, signal.SIGKILL)\n")
    ),
    "stops the process that imports it": diff(
        "calc.py", CALC, calc_with("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n")
    ),
    "skips the calling test from inside the call": diff(
        "calc.py", CALC, calc_with(body='    import pytest\n\n    pytest.skip("later")\n')
    ),
    "renames the failing test's file away": (
        "diff --git a/tests/test_calc.py b/tests/test_moved.py\nsimilarity index 100%\n"
        "rename from tests/test_calc.py\nrename to tests/test_moved.py\n"
    ),
    "locks the work dir for the next command": diff(
        "calc.py", CALC, calc_with("import os\nos.chmod('/work/repo', 0)\nos.chmod('/work', 0)\n")
    ),
    "pytest configuration in pyproject.toml deselects the failing test": diff(
        "pyproject.toml",
        None,
        '[tool.pytest.ini_options]\naddopts = "--deselect tests/test_calc.py::test_add"\n',
    ),
}
HONEST_WRONG = diff("calc.py", CALC, calc_with(body="    return b - a\n"))
# the honest wrong patch keeps test_mul (pass-to-pass) and fails both hidden tests; test_add fails
# on the base and is not counted (SWE-bench's rule): 1 of 3
WRONG = round(1 / 3, 4)
HONEST_FIX = diff("calc.py", CALC, calc_with(body="    return a + b\n"))
# A command gets 8 s: an honest run takes 1-2 s on a loaded 2-core machine; a forgery that stops
# its caller (SIGSTOP) waits out the limit in each command it stops.
FORGERY_LIMITS = RepoRunLimits(wall_s=90, cpu_s=60, command_timeout_s=8)


class Judged:
    """Patches judged in one identity, on a forgery repository's workspace (`hidden`: its hidden
    tests, unless a judgement names others)."""

    def __init__(self, identity: str, workspace, runs: bool, hidden: str = HIDDEN):
        self.identity = identity
        self.workspace = workspace
        self.runs = runs
        self.hidden = hidden

    def judge(self, patch: str, hidden: str | None = None):
        from fleet_pipelines.domain.models import Task
        from fleet_pipelines.evaluation.repo_problems import patch_candidate
        from fleet_pipelines.scoring.patch import evidence_checks

        hidden = self.hidden if hidden is None else hidden
        evidence = score_patch(self.workspace, patch, hidden, FORGERY_LIMITS)
        task = Task.from_fields("forge", {"description": "Fix add.", "role": "DEV", "tests": hidden})
        checks = {c.name: c for c in evidence_checks(self.workspace, task, True, evidence)}
        return evidence, checks, patch_candidate("a1", evidence)


def _repo_driver(no_caps: bool, procs: list[Path]) -> subprocess.Popen:
    """The sandbox suite's driver, running this suite's program: as uid 65534 without
    capabilities (in `procs`' cgroups), or as root with an empty bounding set."""
    from tests.integration.sandbox_identities import _driver

    return _driver(procs, as_root=no_caps, no_caps=no_caps, program=_HOSTILE_DRIVER)


IDENTITIES = ["root", "no capabilities", "root, empty bounding set"]


@pytest.fixture(scope="module", params=IDENTITIES)
def judged(request) -> Iterator[Judged]:
    """The forgery repository, prepared and judged as one identity."""
    with judged_repository(request.param, {"calc.py": CALC, "tests/test_calc.py": VISIBLE}, HIDDEN) as done:
        yield done


@contextlib.contextmanager
def judged_repository(identity: str, files: dict[str, str], hidden: str) -> Iterator[Judged]:
    """A repository of `files`, prepared and judged as `identity`: this process as root, or a
    driver process (uid 65534 without capabilities in a delegated cgroup; root with an empty
    bounding set) that runs each of the repository job's sandboxes."""
    import dataclasses
    import shutil
    import tempfile
    from contextlib import ExitStack

    from fleet_pipelines.sandbox import SandboxResult
    from fleet_pipelines.workspace import runs
    from fleet_pipelines.workspace.checkout import make_writable

    if not isolation_available()[0]:
        pytest.fail("the forgery suite needs the bubblewrap sandbox")
    root = Path(tempfile.mkdtemp(prefix="fleet-forgery-"))
    os.chmod(root, 0o755)
    with ExitStack() as stack, pytest.MonkeyPatch.context() as patch:
        runs_anything = identity != "root, empty bounding set"
        if identity != "root":
            from tests.integration.sandbox_identities import NOBODY, delegated_cgroups

            procs = [] if not runs_anything else stack.enter_context(delegated_cgroups(NOBODY))
            driver = _repo_driver(not runs_anything, procs)
            stack.callback(driver.wait, 30)
            stack.callback(driver.stdin.close)
            ok, why = json.loads(driver.stdout.readline())
            assert ok == runs_anything, why

            def run_python(source, limits, files=None, mounts=None, tools=(), program_mb=0):
                tools = tuple(t for t in tools if sandbox_readable(t))
                request_line = {
                    "source": source,
                    "limits": dataclasses.asdict(limits),
                    "files": files or {},
                    "mounts": mounts or {},
                    "tools": list(tools),
                    "program_mb": program_mb,
                }
                driver.stdin.write(json.dumps(request_line) + "\n")
                driver.stdin.flush()
                return SandboxResult(**json.loads(driver.stdout.readline()))

            patch.setattr(runs, "run_python", run_python)
        source = make_repo(root / "src", files)
        workspace = prepare_workspace(
            f"forgery-{identity.replace(' ', '-').replace(',', '')}",
            RepoSpec(url=str(source)),
            root / "ws",
            run_limits=FORGERY_LIMITS,
        )
        try:
            yield Judged(identity, workspace, runs_anything, hidden)
        finally:
            make_writable(root)
            shutil.rmtree(root, ignore_errors=True)


def sandbox_readable(path: str) -> bool:
    """Whether uid 65534 can run a tool (ruff in a virtualenv under /root cannot be bound)."""
    from fleet_pipelines.sandbox.setup import _readable_by_others

    return _readable_by_others(os.path.realpath(path))


def test_the_honest_fix_scores_1_and_the_honest_wrong_patch_a_third(judged: Judged):
    fixed, fixed_checks, fixed_candidate = judged.judge(HONEST_FIX)
    wrong, wrong_checks, wrong_candidate = judged.judge(HONEST_WRONG)
    if not judged.runs:
        assert fixed.not_run and wrong.not_run and fixed_checks["tests"].not_run
        return
    assert fixed_checks["tests"].value == 1.0 and fixed_checks["patch_scope"].value == 1.0, fixed_checks[
        "tests"
    ]
    assert fixed_candidate.passed and fixed_candidate.examples_passed == 2
    assert wrong_checks["tests"].value == WRONG, wrong_checks["tests"]
    assert not wrong_candidate.passed and wrong_candidate.examples_passed == 1


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_forged_verdict_scores_no_higher_than_the_honest_wrong_patch(judged: Judged, name: str):
    forged, checks, candidate = judged.judge(FORGERIES[name])
    if not judged.runs:
        assert forged.not_run and checks["tests"].not_run and checks["tests"].value is None
        return
    tests = checks["tests"]
    assert tests.value is not None and tests.value <= WRONG, (tests.evidence, tests.output)
    assert not tests.forgeable
    assert not candidate.passed and candidate.hidden_status != "passed", candidate
    assert candidate.examples_passed <= 1 and candidate.examples_total <= 2, candidate
    if name == "kills every other process on import":  # that one ends the job itself: no report, 0
        said = checks["tests"].evidence  # never "does not apply": it applied, and left no verdict
        assert said.startswith("the run ended before its report: ") and said.endswith(": tests score 0")
        assert checks["patch_applies"].evidence.startswith("no verdict: the run ended before its report")
    else:
        assert forged.applies, forged.apply_output  # the job outlives whatever the patch did
        assert forged.hidden is not None and forged.hidden.passed == 0, forged.hidden
    if name in FLAGGED:
        assert checks["patch_scope"].value == 0.0 and forged.flags, checks["patch_scope"]


FLAGGED = {
    "the hidden skip, and the visible test rewritten to match the bug",
    "renames the failing test's file away",
    "a dist-info entry point loads a pytest plugin",
    "pprint.py at the root runs before pytest",
    "300 empty tests added",
    "the visible test edited to match the bug",
    "conftest.py, pytest.ini and a plugin at the root",
    "sitecustomize.py and a .pth file",
    "pytest configuration in pyproject.toml deselects the failing test",
}
