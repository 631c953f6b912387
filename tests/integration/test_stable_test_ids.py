"""pytest names a parameter it cannot print by its place in the list (`case3`); parameters taken
from a set are placed in the process's hash order: the string hash seed and, for a tuple holding
None, its address (until Python 3.12). Each job of the judge is a new process: with both left to
chance, a test's id on the base was another case's, or no id at all, after the patch, so a broken
case was "flaky, left out" and a breaking patch passed the gate (isodate 0.7.2's `expected20`).
The sandbox's job fixes the seed and, where the runtime allows, turns address randomization off."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleet_pipelines.domain.models import RepoSpec, Task
from fleet_pipelines.evaluation.real_suites import comment_patch, diff, gate
from fleet_pipelines.evaluation.repo_suite import git_commit_all
from fleet_pipelines.sandbox import isolation_available
from fleet_pipelines.workspace.prepare import prepare_workspace

pytestmark = pytest.mark.skipif(not isolation_available()[0], reason="needs the bubblewrap sandbox")

CODE = "def spell(value):\n    return ' '.join(str(part) for part in value)\n"
BROKEN = "def spell(value):\n    return ' '.join(str(part) for part in value if part != 1)\n"
TESTS = """import pytest

from words import spell

CASES = {((word, None), f"{word} None") for word in "abcdefghijklmnop"} | {(("k", 1), "k 1")}


@pytest.mark.parametrize("case, expected", CASES)
def test_spell(case, expected):
    assert spell(case) == expected
"""


def test_ids_of_parameters_from_a_set_name_the_same_case_in_every_job(tmp_path: Path, traversable_dir):
    source = tmp_path / "src"
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "PATH": os.environ["PATH"]}
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(source)], check=True, env=env)
    (source / "words.py").write_text(CODE)
    (source / "test_words.py").write_text(TESTS)
    git_commit_all(source, "words")
    workspace = prepare_workspace(
        "stable-ids", RepoSpec(url=str(source), test_command="pytest -q test_words.py"), traversable_dir
    )
    assert workspace.baseline is not None and workspace.baseline.passed == 17
    task = Task(task_id="stable-ids", description="a change", role="DEV", num_agents=1)
    for _ in range(2):  # the job that plans on the base, then a later one
        failures, _, evidence = gate(workspace, task, comment_patch(source, "words.py"))
        assert failures == [] and evidence.tests is not None and evidence.tests.passed == 17, failures
        assert "flaky" not in evidence.tests.first_failure
    failures, _, evidence = gate(workspace, task, diff(source, "words.py", BROKEN))
    assert failures and failures[0].startswith("tests = ") and evidence.tests is not None
    assert evidence.tests.failed == 1 and evidence.tests.failing[0].startswith(
        "test_words.py::test_spell[case"
    )
