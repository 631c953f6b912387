"""The judge's pytest runs on a project whose configuration names plugins the run does not load
(`sandbox_job.ADDOPTS_PLUGIN`), with the real pytest in a fresh interpreter as the sandbox runs it:
`--cov=pkg` or `-n auto` in addopts no longer stops the run ("unrecognized arguments"), an option
a conftest defines stays, and a project's `importlib` import mode is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fleet_pipelines.workspace.sandbox_job import ADDOPTS_PLUGIN, PYTEST_DEPRECATIONS


def pytest_run(project: Path, plugins: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(plugins),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTEST_ADDOPTS": "-p fleet_addopts",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_addopts_of_plugins_not_loaded_are_left_out_and_the_rest_is_kept(tmp_path: Path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "fleet_addopts.py").write_text(ADDOPTS_PLUGIN)
    project = tmp_path / "project"
    (project / "tests" / "a").mkdir(parents=True)
    (project / "tests" / "b").mkdir()
    (project / "pytest.ini").write_text(
        "[pytest]\naddopts = --cov=pkg --cov-report term-missing -n auto --strict-markers "
        "--flavour=sour --import-mode=importlib\nmarkers = slow\n"
    )
    (project / "conftest.py").write_text("def pytest_addoption(parser):\n    parser.addoption('--flavour')\n")
    # the same basename twice: only the importlib mode collects both
    for folder in ("a", "b"):
        (project / "tests" / folder / "test_same.py").write_text(
            "import pytest\n\n\n@pytest.mark.slow\ndef test_it(pytestconfig):\n"
            "    assert pytestconfig.getoption('flavour') == 'sour'\n"
        )

    ran = pytest_run(project, plugins, FLEET_IMPORT_MODE="append")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 passed" in ran.stdout  # each reads the conftest's option, from addopts: kept
    said = (
        "addopts options no plugin of this run defines, left out: --cov=pkg --cov-report term-missing -n auto"
    )
    assert said in ran.stderr
    # the test command's own arguments are never touched: a wrong one is still refused
    ran = pytest_run(project, plugins, "--no-such-option")
    assert ran.returncode == 4 and "unrecognized arguments: --no-such-option" in ran.stderr

    # without a configured import mode, FLEET_IMPORT_MODE=append replaces pytest's prepend:
    # the tests' folder is on sys.path after the standard library, not ahead of it
    (project / "pytest.ini").write_text("[pytest]\naddopts = --cov=pkg\n")
    (project / "tests" / "b" / "test_same.py").unlink()
    (project / "tests" / "a" / "test_same.py").write_text(
        "import sys\n\n\ndef test_it():\n    assert sys.path.index(__file__.rsplit('/', 1)[0]) > 0\n"
    )
    assert pytest_run(project, plugins).returncode == 1  # prepend: the folder is sys.path[0]
    ran = pytest_run(project, plugins, FLEET_IMPORT_MODE="append")
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_deprecation_of_the_judges_pytest_or_its_plugins_fails_nothing_under_filterwarnings_error(
    tmp_path: Path,
):
    """blinker 1.8.2 pins pytest-asyncio 0.23.6, which requires pytest < 9: its pin is relaxed, and
    the release that installs beside our pytest warns at configuration (a PytestDeprecationWarning)
    that blinker's `filterwarnings = error` made an internal error of every run. The judge's
    options ignore such deprecations; plain pytest here still fails, and so does a test's own one."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "fleet_addopts.py").write_text(ADDOPTS_PLUGIN)
    (plugins / "newer_plugin.py").write_text(
        "import warnings\n\nimport pytest\n\n\ndef pytest_configure(config):\n"
        "    warnings.warn(pytest.PytestDeprecationWarning('an option of this release is unset'))\n"
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (project / "test_it.py").write_text(
        "import warnings\n\nimport pytest\n\n\ndef test_plain():\n    assert True\n\n\n"
        "def test_its_own_warning():\n    warnings.warn(UserWarning('an error here'))\n"
    )
    ran = pytest_run(project, plugins, "-p", "newer_plugin")
    assert ran.returncode == 3 and "an option of this release is unset" in ran.stdout + ran.stderr
    ran = pytest_run(project, plugins, "-p", "newer_plugin", *PYTEST_DEPRECATIONS)
    assert ran.returncode == 1 and "1 failed, 1 passed" in ran.stdout, ran.stdout + ran.stderr
    assert "UserWarning: an error here" in ran.stdout
