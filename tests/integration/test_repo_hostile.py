"""A hostile repository changes nothing outside its sandbox: hooks and filters never run (neither
the repository's nor the host's git configuration), submodules are not followed unless asked,
symlinks cannot reach outside the workspace, files and repositories have size caps, and a test
command that forks or hangs is bounded like any sandboxed run. Real git, real sandbox."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
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
    limits = RepoRunLimits(wall_s=20, cpu_s=10, memory_mb=512, max_processes=32, command_timeout_s=8)
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
def test_a_patch_cannot_write_outside_the_sandboxed_copy(tmp_path, root):
    source = make_repo(tmp_path / "src", {"a.py": "x = 1\n", "tests/test_a.py": "def test_a():\n    pass\n"})
    ws = prepare_workspace("escape", RepoSpec(url=str(source)), root)
    outside = tmp_path / "escaped.txt"
    escape = f"--- /dev/null\n+++ b/../../../../..{outside}\n@@ -0,0 +1 @@\n+escaped\n"
    evidence = score_patch(ws, escape)
    assert not evidence.applies and not outside.exists()
    body = [
        "import contextlib",
        "with contextlib.suppress(OSError):",
        f"    open({str(outside)!r}, 'w').write('x')",
        "open('/mnt/repo/a.py', 'w').write('y')",  # read-only: raises, the test fails
    ]
    added = "".join(f"+    {line}\n" for line in body)
    writer = (
        f"--- a/tests/test_a.py\n+++ b/tests/test_a.py\n@@ -1,2 +1,5 @@\n def test_a():\n-    pass\n{added}"
    )
    evidence = score_patch(ws, writer)
    assert evidence.applies and evidence.tests is not None and evidence.tests.status == "failed"
    assert not outside.exists()
    assert (Path(ws.path) / "a.py").read_text() == "x = 1\n"  # the workspace is read-only in there


@needs_sandbox
def test_declared_dependencies_are_installed_once_into_a_read_only_environment(tmp_path, root):
    """The repository's requirements.txt (six, from the package index: the one step with network)
    lands in the workspace's environment, which every sandboxed run mounts read-only."""
    test = "import six\n\n\ndef test_six():\n    assert six.PY3\n"
    source = make_repo(tmp_path / "src", {"requirements.txt": "six\n", "tests/test_six.py": test})
    ws = prepare_workspace("deps", RepoSpec(url=str(source)), root)
    assert ws.dependencies == ["six"]
    assert ws.baseline is not None and ws.baseline.status == "passed" and ws.baseline.passed == 1
    env = Path(ws.env_path)
    assert (env / "six.py").exists() and (env / "pytest").is_dir()  # the test runner, copied from here
    assert not os.stat(env / "six.py").st_mode & 0o222
    again = prepare_workspace("deps", RepoSpec(url=str(source)), root)  # same commit: built once
    assert (
        again.env_path == ws.env_path
        and os.stat(env / "six.py").st_mtime_ns == os.stat(Path(again.env_path) / "six.py").st_mtime_ns
    )


@needs_sandbox
def test_a_patch_that_forges_the_repositorys_own_tests_still_fails_the_hidden_ones(tmp_path, root):
    """A conftest.py and a sitecustomize.py that exit 0 end the repository's own test command
    with status 0 but no pytest report, which its unpatched run gave: an error, not a pass. The
    hidden tests run isolated (their own configuration, no conftest, no start-up hooks of the
    patch's) and still fail on the unfixed bug."""
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
    assert ws.baseline is not None and ws.baseline.counted
    assert evidence.applies and evidence.tests is not None and evidence.tests.status == "error"
    assert evidence.tests.first_failure.startswith("no test report: the run exited (0)")
    assert evidence.hidden is not None and evidence.hidden.status == "failed"
    assert (evidence.hidden.passed, evidence.hidden.failed) == (0, 1)


@needs_sandbox
def test_code_under_test_that_exits_0_on_import_passes_no_tests(tmp_path, root):
    """The patched module ends the process with status 0 as the tests import it: neither the
    repository's tests nor the hidden ones wrote a report, so both are errors and the patch's
    tests check is 0 (it was 1.0: the exit status alone said "passed")."""
    from fleet_pipelines.domain.models import Task
    from fleet_pipelines.workspace.checks import patch_checks

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
    assert (evidence.tests.status, evidence.hidden.status) == ("error", "error")
    assert "no test report" in evidence.hidden.first_failure
    task = Task.from_fields("exit0", {"description": "Fix add.", "role": "DEV", "tests": hidden})
    checks = {c.name: c for c in patch_checks(ws, task, f"```diff\n{exit0}```", RepoRunLimits())}
    assert checks["patch_applies"].value == 1.0 and checks["tests"].value == 0.0


def test_retention_removes_a_tasks_read_only_workspaces(tmp_path, root):
    from fleet_pipelines.resources.history import HistoryResource

    source = make_repo(tmp_path / "src", {"a.py": "x = 1\n"})
    checkout(str(source), "main", root / "gone-1" / "abc" / "repo")  # read-only, as prepare leaves it
    history = HistoryResource(base_path=str(tmp_path), max_age_seconds=1, workspaces_dir=str(root))
    assert history.remove_workspace("gone-1") and not (root / "gone-1").exists()
    assert not history.remove_workspace("gone-1") and not history.remove_workspace("never")
