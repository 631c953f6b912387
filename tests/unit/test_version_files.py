"""The version module a build backend generates, written from pyproject.toml alone
(`workspace.version_files`): what setuptools-scm and hatch-vcs would write, and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

from fleet_pipelines.workspace.environment import read_pyproject
from fleet_pipelines.workspace.version_files import version_tuple, write_version_files

HATCH = '[tool.hatch.build.hooks.vcs]\nversion-file = "src/pkg/_version.py"\n'
SCM = '[tool.setuptools_scm]\nwrite_to = "src/pkg/version.py"\nfallback_version = "0.0.0.dev0"\n'


def _project(tmp_path: Path, pyproject: str, pkg_info: str = "") -> Path:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text(pyproject)
    if pkg_info:
        (tmp_path / "PKG-INFO").write_text(f"Metadata-Version: 2.3\nName: pkg\nVersion: {pkg_info}\n")
    return tmp_path


def _written(project: Path) -> list[str]:
    return write_version_files(project, read_pyproject(project))


def _module(path: Path) -> dict:
    namespace: dict = {}
    exec(path.read_text(), namespace)
    return namespace


def test_hatch_vcs_version_file_holds_the_sdists_version(tmp_path):
    project = _project(tmp_path, HATCH, pkg_info="4.11.0")
    assert _written(project) == [
        "src/pkg/_version.py (version 4.11.0, as tool.hatch.build.hooks.vcs.version-file asks)"
    ]
    module = _module(project / "src/pkg/_version.py")
    assert module["__version__"] == module["version"] == "4.11.0"
    assert module["__version_tuple__"] == module["version_tuple"] == (4, 11, 0)


def test_setuptools_scm_without_an_sdist_takes_the_fallback_version(tmp_path):
    project = _project(tmp_path, SCM)
    assert _written(project) == [
        "src/pkg/version.py (version 0.0.0.dev0, as tool.setuptools_scm.write_to asks)"
    ]
    assert _module(project / "src/pkg/version.py")["version_tuple"] == (0, 0, 0, "dev0")


def test_no_configured_fallback_is_0_0_0_and_a_template_is_followed(tmp_path):
    project = _project(
        tmp_path,
        '[tool.setuptools_scm]\nversion_file = "src/pkg/VERSION.txt"\n'
        'version_file_template = "v{version} {version_tuple}"\n',
    )
    _written(project)
    assert (project / "src/pkg/VERSION.txt").read_text() == "v0.0.0 (0, 0, 0)"


def test_a_file_the_checkout_has_is_left_alone_and_nothing_is_written_without_configuration(tmp_path):
    project = _project(tmp_path, SCM)
    (project / "src/pkg/version.py").write_text("version = 'committed'\n")
    assert _written(project) == []
    assert (project / "src/pkg/version.py").read_text() == "version = 'committed'\n"
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.hatch]\nbuild = "not a table"\n')
    assert _written(other) == [] and sorted(os.listdir(other)) == ["pyproject.toml"]
    assert _written(tmp_path / "missing") == []


def test_paths_outside_the_project_through_links_or_into_missing_folders_are_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (project / "link").symlink_to(outside)
    for path, reason in [
        ("../escape.py", "outside the project"),
        ("/abs/version.py", "outside the project"),
        ("link/version.py", "link is a link or not a folder of the checkout"),
        ("absent/version.py", "absent is a link or not a folder of the checkout"),
    ]:
        (project / "pyproject.toml").write_text(f'[tool.setuptools_scm]\nwrite_to = "{path}"\n')
        assert _written(project) == [f"{path}: not written (tool.setuptools_scm.write_to): {reason}"]
    assert os.listdir(outside) == [] and not (tmp_path / "escape.py").exists()


def test_a_template_with_other_fields_or_a_format_spec_is_reported_not_written(tmp_path):
    project = _project(tmp_path, HATCH)
    for template, said in [
        ("{scm_version.tag}", "uses {scm_version.tag}: only {version} and {version_tuple} are filled"),
        ("{version:>999999999}", "uses {version:>999999999}: only {version} and {version_tuple} are"),
        ("{version", "does not parse: "),
    ]:
        (project / "pyproject.toml").write_text(HATCH + f"template = {template!r}\n")
        [reason] = _written(project)
        assert reason.startswith(
            "src/pkg/_version.py: not written, its template (tool.hatch.build.hooks.vcs.version-file) " + said
        ), reason
        assert not (project / "src/pkg/_version.py").exists()


def test_setup_pys_literal_use_scm_version_is_read_never_run_and_a_computed_one_is_not(tmp_path):
    project = tmp_path / "literal"
    (project / "pkg").mkdir(parents=True)
    (project / "setup.py").write_text(
        "import setuptools\nraise SystemExit('never run')\n"
        "setuptools.setup(name='pkg', use_scm_version={'write_to': 'pkg/_version.py', "
        "'fallback_version': '2.0'})\n"
    )
    assert _written(project) == ["pkg/_version.py (version 2.0, as setup.py's use_scm_version asks)"]
    assert _module(project / "pkg/_version.py")["__version__"] == "2.0"
    computed = tmp_path / "computed"
    (computed / "pkg").mkdir(parents=True)
    (computed / "setup.py").write_text(
        "from setuptools import setup\nOPTIONS = {'write_to': 'pkg/_version.py'}\n"
        "setup(use_scm_version=OPTIONS)\nsetup(use_scm_version={'write_to': WHERE})\n"
    )
    assert _written(computed) == [] and not (computed / "pkg/_version.py").exists()


def test_version_tuple_is_setuptools_scms():
    assert version_tuple("1.2.3.dev4+gabc.d20240101") == (1, 2, 3, "dev4", "gabc", "d20240101")
