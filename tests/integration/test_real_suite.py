"""The repository judge on a real project: inflection 0.5.1 from its pinned, hash-checked PyPI
sdist (downloaded once into .cache/sdists/), prepared as `fleet run --repo` prepares a repository
and judged in the real sandbox. Counting is SWE-bench's: the base's passing tests must still
pass, and the hidden test names the bug."""

from __future__ import annotations

import gettext
import shutil
import subprocess

import pytest

from fleet_pipelines.domain.models import Constraints, RepoSpec, Task
from fleet_pipelines.evaluation.real_suites import (
    SUITES,
    Suite,
    comment_patch,
    diff,
    gate,
)
from fleet_pipelines.evaluation.sdists import fetch, replace_line, unpack_repo
from fleet_pipelines.sandbox import isolation_available
from fleet_pipelines.workspace.prepare import prepare_workspace

pytestmark = pytest.mark.skipif(not isolation_available()[0], reason="needs the bubblewrap sandbox")
INFLECTION = next(s for s in SUITES if s.name == "inflection")


def test_inflection_comment_passes_a_mutant_fails_and_a_bug_fix_is_told_from_a_comment(
    tmp_path, traversable_dir
):
    archive = fetch(INFLECTION.sdist)
    path, old, new = INFLECTION.mutant
    repo = unpack_repo(archive, tmp_path / "clean")
    workspace = prepare_workspace(
        "inflection", RepoSpec(url=str(repo), test_command=INFLECTION.test_command), traversable_dir
    )
    task = Task(task_id="inflection", description="a change", role="DEV", num_agents=1)

    failures, checks, evidence = gate(workspace, task, comment_patch(repo, path))
    assert failures == [], failures
    assert evidence.tests is not None and evidence.tests.passed >= 455 and evidence.tests.failed == 0
    tests = next(c for c in checks if c.name == "tests")
    assert "pass-to-pass in plain pytest" in tests.evidence and "re-run across the boundary" in tests.evidence

    broken = diff(repo, path, replace_line((repo / path).read_text(), old, new))
    failures, _, evidence = gate(workspace, task, broken)
    assert failures and failures[0].startswith("tests = ")
    assert (
        evidence.tests is not None and "test_inflection.py::test_ordinal[13-13th]" in evidence.tests.failing
    )

    failures, _, evidence = gate(workspace, task, "")
    assert failures == [] and evidence.applies and evidence.apply_output == "no change proposed"

    buggy = unpack_repo(archive, tmp_path / "buggy", INFLECTION.mutant)
    bug_ws = prepare_workspace(
        "inflection-bug", RepoSpec(url=str(buggy), test_command=INFLECTION.test_command), traversable_dir
    )
    bug_task = task.model_copy(update={"constraints": Constraints(tests=INFLECTION.hidden)})
    fix = diff(buggy, path, replace_line((buggy / path).read_text(), new, old))
    failures, _, evidence = gate(bug_ws, bug_task, fix)
    assert failures == [], failures
    assert evidence.hidden is not None and (evidence.hidden.passed, evidence.hidden.failed) == (1, 0)
    # the base's failing tests (the bug's) are not counted: they neither help the fix nor fail a no-op
    assert evidence.tests is not None and evidence.tests.not_counted >= 8 and evidence.tests.failed == 0
    failures, _, evidence = gate(bug_ws, bug_task, comment_patch(buggy, path))
    assert failures and evidence.hidden is not None and evidence.hidden.failed == 1
    # unless the task names them: its fail-to-pass tests count, across the boundary
    named = bug_task.model_copy(update={"description": "test_ordinal fails for 13: ordinal(13) is not 'th'"})
    failures, _, evidence = gate(bug_ws, named, fix)
    assert failures == [] and evidence.tests is not None, failures
    assert evidence.tests.fail_to_pass == evidence.tests.fail_to_pass_passed >= 1, evidence.tests
    failures, _, evidence = gate(bug_ws, named, comment_patch(buggy, path))
    assert failures and evidence.tests is not None and evidence.tests.fail_to_pass_passed == 0
    # hidden tests pytest collects without their source naming each (a TestCase not named Test*):
    # all of them in one session, judged as any others
    unittest_style = (
        "import unittest\nfrom inflection import ordinal\n\n\nclass Ordinals(unittest.TestCase):\n"
        "    def test_thirteenth(self):\n        self.assertEqual(ordinal('13'), 'th')\n"
    )
    as_case = bug_task.model_copy(update={"constraints": Constraints(tests=unittest_style)})
    failures, _, evidence = gate(bug_ws, as_case, fix)
    assert failures == [] and evidence.hidden is not None and evidence.hidden.passed == 1, failures


@pytest.mark.parametrize("name", ["wcwidth", "semver"])
def test_projects_whose_configuration_names_coverage_are_judged_with_their_test_dependencies(
    name, tmp_path, traversable_dir
):
    """wcwidth 0.2.13 and semver 3.0.4 put pytest-cov's `--cov` in their addopts: before, pytest
    refused every run ("unrecognized arguments") and no test could be judged. Their test groups
    install (pytest-cov among them, loaded with `--no-cov`: the judge measures no coverage) and
    semver's `importlib` import mode is kept. wcwidth pins its test requirements for Python 3.9:
    two have no wheel here (left out by name with pip's reason), and the others install once
    their versions are left out (pip could not meet them together)."""
    suite = next(s for s in SUITES if s.name == name)
    archive = fetch(suite.sdist)
    repo = unpack_repo(archive, tmp_path / "clean")
    workspace = prepare_workspace(
        name, RepoSpec(url=str(repo), test_command=suite.test_command), traversable_dir
    )
    assert "pytest-cov" in workspace.test_dependencies
    if name == "semver":
        assert not workspace.test_dependencies_error
    else:
        error = workspace.test_dependencies_error
        assert "restructuredtext-lint==1.4.0: no wheel meets it" in error, error
        assert "versions left out: pip could not meet them together" in error, error
    baseline = workspace.baseline
    assert baseline is not None and baseline.status == "passed" and baseline.passed >= 38, baseline
    # pytest-cov loaded, with --no-cov: their options stand, nothing is measured
    assert "left out: " not in baseline.output and "coverage: " not in baseline.output

    task = Task(task_id=name, description="a change", role="DEV", num_agents=1)
    path, old, new = suite.mutant
    failures, _, evidence = gate(workspace, task, comment_patch(repo, path))
    assert failures == [] and evidence.tests is not None, failures
    assert evidence.tests.passed == baseline.passed and evidence.tests.failed == 0
    broken = diff(repo, path, replace_line((repo / path).read_text(), old, new))
    failures, _, evidence = gate(workspace, task, broken)
    assert failures and failures[0].startswith("tests = ") and evidence.tests is not None
    assert evidence.tests.failed > 0


def test_a_project_that_imports_its_build_generated_version_module_is_judged(tmp_path, traversable_dir):
    """humanize 4.11.0 imports `humanize._version`, which hatch-vcs writes at build time and its
    .gitignore keeps out of a checkout: every test module failed to import and nothing could be
    judged. The module is written from its pyproject.toml, with the sdist's version. Its
    translations (`.mo`, compiled by its own script and ignored by git too) are compiled from
    their `.po`: its i18n tests skipped themselves without them (598 of 621 passed), now all pass."""
    suite = next(s for s in SUITES if s.name == "humanize")
    repo = unpack_repo(fetch(suite.sdist), tmp_path / "clean")
    tracked = subprocess.run(["git", "-C", str(repo), "ls-files"], capture_output=True, text=True, check=True)
    assert "src/humanize/_version.py" not in tracked.stdout.split()  # its .gitignore names it
    assert not any(path.endswith(".mo") for path in tracked.stdout.split())
    workspace = prepare_workspace(
        "humanize", RepoSpec(url=str(repo), test_command=suite.test_command), traversable_dir
    )
    assert workspace.generated[0] == (
        "src/humanize/_version.py (version 4.11.0, as tool.hatch.build.hooks.vcs.version-file asks)"
    )
    catalogs = workspace.generated[1:]
    assert len(catalogs) == 33 and not [line for line in catalogs if "not written" in line], catalogs
    # Babel refuses `Language: arabic (عربي)` (ar) and an empty `PO-Revision-Date` (uk_UA), which
    # msgfmt compiles: both compiled without those header fields, and said so
    noted = sorted(line.split("/")[3] for line in catalogs if "header's Language and dates left out" in line)
    assert noted == ["ar", "uk_UA"], catalogs
    checkout = traversable_dir / "humanize" / workspace.commit / "repo"
    if shutil.which("msgfmt"):  # GNU gettext's own compiler: gettext reads the same messages
        for source in sorted(checkout.glob("src/humanize/locale/*/LC_MESSAGES/humanize.po")):
            reference = tmp_path / f"{source.parent.parent.name}.mo"
            subprocess.run(["msgfmt", "-o", str(reference), str(source)], check=True)
            ours = gettext.GNUTranslations(source.with_suffix(".mo").open("rb"))
            theirs = gettext.GNUTranslations(reference.open("rb"))
            messages = {k: v for k, v in ours._catalog.items() if k != ""}  # "": the header
            assert messages == {k: v for k, v in theirs._catalog.items() if k != ""}, source
            assert [ours.ngettext("a", "b", n) for n in range(12)] == [
                theirs.ngettext("a", "b", n) for n in range(12)
            ]
    written = checkout / "src/humanize/_version.py"
    assert "__version__ = version = '4.11.0'" in written.read_text()
    baseline = workspace.baseline
    assert baseline is not None and baseline.status == "passed" and baseline.passed == 621, baseline


def test_a_package_pytest_itself_imports_is_judged_by_plain_pytest(tmp_path, traversable_dir):
    """pluggy 1.5.0 (not one of the benchmark's suites): pytest imports pluggy, so the judge's
    pytest could not be imported ahead of the repository (the environment's copy is removed: the
    tests must judge the repository's), and every patch's job ended before its report ("the patch
    does not apply"). Its pass-to-pass tests are judged by plain pytest, which runs on the
    repository's pluggy as a developer's does; its tox.ini's `coverage: coverage` (a line for
    tox's `coverage` environments) is no requirement."""
    pluggy = Suite(
        "pluggy",
        "1.5.0",
        "2cffa88e94fdc978c4c574f15f9e59b7f4201d439195c3715ca9e2486f1d0cf1",
        "pytest testing",
    )
    repo = unpack_repo(fetch(pluggy.sdist), tmp_path / "clean")
    workspace = prepare_workspace(
        "pluggy", RepoSpec(url=str(repo), test_command=pluggy.test_command), traversable_dir
    )
    assert workspace.own_removed == ["pluggy"] and not workspace.test_dependencies_error
    assert workspace.baseline is not None and workspace.baseline.passed == 109, workspace.baseline
    task = Task(task_id="pluggy", description="a change", role="DEV", num_agents=1)
    failures, _, evidence = gate(workspace, task, comment_patch(repo, "src/pluggy/_result.py"))
    assert failures == [] and evidence.applies and evidence.tests is not None, failures
    assert (evidence.tests.passed, evidence.tests.failed) == (109, 0)
    path = "src/pluggy/_result.py"  # a hook's result is never returned
    text = (repo / path).read_text()
    broken = diff(
        repo,
        path,
        replace_line(text, " " * 12 + "return cast(ResultType, self._result)", " " * 12 + "return None"),
    )
    failures, _, evidence = gate(workspace, task, broken)
    assert failures and failures[0].startswith("tests = ") and evidence.applies
