"""Spectrum-guided localisation end to end: the baseline, in the sandbox, traces the lines the
failing tests execute on the base commit, and the focus of a `json` answer keeps, of two functions
of one name (an `if`/`else` pair), the one that ran."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleet_pipelines.domain.models import RepoSpec
from fleet_pipelines.domain.repomap import focus
from fleet_pipelines.evaluation.repo_suite import git_commit_all
from fleet_pipelines.sandbox import isolation_available
from fleet_pipelines.workspace.prepare import prepare_workspace
from fleet_pipelines.workspace.view import edit_files
from tests.unit.test_repomap_executed import COMPAT  # pairs: Python 3's at lines 7-8, Python 2's at 12-13

pytestmark = pytest.mark.skipif(not isolation_available()[0], reason="needs the bubblewrap sandbox")

TESTS = """from compat import pairs


def test_pairs():
    assert pairs({"a": 1}) == [("a", 1)]


def test_passes():
    assert True
"""


def test_the_baseline_traces_what_the_failing_tests_ran_and_focus_keeps_that_function(
    tmp_path: Path, traversable_dir: Path
):
    source = tmp_path / "src"
    source.mkdir()
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "PATH": os.environ["PATH"]}
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(source)], check=True, env=env)
    (source / "compat.py").write_text(COMPAT)
    (source / "tests").mkdir()
    (source / "tests" / "test_compat.py").write_text(TESTS)
    git_commit_all(source, "compat")
    spec = RepoSpec(url=str(source), test_command="python -m pytest -q tests")
    ws = prepare_workspace("localise", spec, traversable_dir)
    base = ws.baseline
    assert base is not None and base.status == "failed" and base.failed == 1 and base.passed == 1
    # the failing test only, and of the code the Python 3 branch only (no test file)
    assert base.executed == {"tests.test_compat::test_pairs": {"compat.py": [(7, 8)]}}
    narrowed = focus(
        edit_files(ws), "pairs returns the keys", base.failing, base.first_failure, base.executed
    )
    assert narrowed == {
        "compat.py": ["    def pairs(d):\n        return list(d.keys())", "        return list(d.keys())"]
    }
