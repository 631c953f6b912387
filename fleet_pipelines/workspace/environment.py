"""The dependency environment of a workspace: built once, mounted read-only (/mnt/env, on
PYTHONPATH) by every sandboxed run of the repository.

It holds the test runner, copied from this interpreter's own installation (pytest and what it
requires: no network), and the repository's declared dependencies (`[project].dependencies` of
its pyproject.toml, `requirements.txt`) plus the task's `setup_command` specifiers, installed
by pip into the folder. That pip install is the only step of a deliberation that may use the
network; it takes wheels only (`--only-binary :all:`), so no package's build code runs on the host.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

TEST_RUNNER = ("pytest",)
PIP_TIMEOUT_S = 600
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class DependencyError(RuntimeError):
    """The dependencies could not be installed."""


def declared_dependencies(project: Path) -> list[str]:
    """The requirement specifiers the project declares (pyproject's [project].dependencies, then
    requirements.txt's lines), without options, URLs or editable installs."""
    found: list[str] = []
    pyproject = project / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(errors="replace"))
        except tomllib.TOMLDecodeError:
            data = {}
        found += [d for d in data.get("project", {}).get("dependencies", []) if isinstance(d, str)]
    requirements = project / "requirements.txt"
    if requirements.is_file():
        for line in requirements.read_text(errors="replace").splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith(("-", ".", "/")) and "://" not in line:
                found.append(line)
    return list(dict.fromkeys(found))


def _distribution_closure(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The installed distributions `names` and everything they require (no extras)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    pending = list(names)
    while pending:
        name = pending.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen[key] = dist
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            match = _NAME.match(requirement)
            if match:
                pending.append(match.group(1))
    return list(seen.values())


def _copy_distribution(dist: importlib.metadata.Distribution, target: Path) -> None:
    for file in dist.files or []:
        if file.parts and file.parts[0] == "..":  # scripts in bin/: not needed
            continue
        source = Path(str(dist.locate_file(file)))
        if source.is_file():
            destination = target / file
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)


def build_environment(project: Path, target: Path, extra: str = "") -> list[str]:
    """Fills `target` (made here) with the test runner and the project's dependencies; returns
    what was installed from the index (empty: nothing needed the network)."""
    target.mkdir(parents=True, exist_ok=False)
    for dist in _distribution_closure(TEST_RUNNER):
        _copy_distribution(dist, target)
    wanted = [*declared_dependencies(project), *shlex.split(extra)]
    if wanted:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-input",
            "--disable-pip-version-check",
        ]
        argv += ["--only-binary", ":all:", "--no-compile", "--target", str(target), "--", *wanted]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, cwd=target)
        except subprocess.TimeoutExpired as exc:
            raise DependencyError(f"pip install took over {PIP_TIMEOUT_S} s: {wanted}") from exc
        if done.returncode != 0:
            raise DependencyError(f"pip install {' '.join(wanted)} failed: {done.stderr.strip()[-800:]}")
    for directory, _dirs, files in os.walk(target):
        os.chmod(directory, 0o555)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o444)
    return wanted
