"""The dependency environment of a workspace: built once, mounted read-only (/mnt/env, on
PYTHONPATH) by every sandboxed run of the repository.

It holds the test runner, copied from this interpreter's own installation (pytest and what it
requires: no network), and the repository's declared dependencies (`[project].dependencies` of
its pyproject.toml, `requirements.txt`) plus the task's `setup_command` specifiers, installed
by pip into the folder, with its declared test dependencies (`declared_test_dependencies`) where
they install: a project's tests often need a plugin or library its package does not. That pip
install is the only step of a deliberation that may use the network; it takes wheels only
(`--only-binary :all:`), so no package's build code runs on the host.

What became of the test dependencies is kept beside them (`STATUS_FILE`): one that no wheel
meets is left out by name with pip's reason and the others install; pins pip cannot meet
together (a lock file resolved for the project's own pytest, which ours replaces) are tried
without their versions; a test group that still fails is left out whole, and the package's own
dependencies are installed without it (`_install`). So are the files the project's build would
generate and the checkout lacks, written into it: version modules (`version_files`) and compiled
message catalogs (`catalogs`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from configparser import ConfigParser
from configparser import Error as ConfigError
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet

from .boundary import repository_names
from .catalogs import write_catalogs
from .version_files import setup_literal, write_version_files

TEST_RUNNER = ("pytest",)
PIP_TIMEOUT_S = 600
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
TEST_GROUPS = ("test", "tests", "testing")  # the names projects give their tests' dependencies
STATUS_FILE = ".fleet-environment.json"  # environment_status()
_NO_STATUS = {"installed": [], "error": "", "own_removed": [], "generated": []}


class DependencyError(RuntimeError):
    """The dependencies could not be installed."""


def read_pyproject(project: Path) -> dict:
    """The project's pyproject.toml as data ({} when it has none or it does not parse)."""
    pyproject = project / "pyproject.toml"
    try:
        return tomllib.loads(pyproject.read_text(errors="replace")) if pyproject.is_file() else {}
    except tomllib.TOMLDecodeError:
        return {}


# tox's conditional line, `FACTORS: requirement`: for the environments named so (pluggy 1.5.0's
# `coverage: coverage`), not the plain test environment
_TOX_FACTORS = re.compile(r"^!?[A-Za-z0-9_.-]+(?:,!?[A-Za-z0-9_.-]+)*\s*:\s")


def _requirement_lines(text: str) -> list[str]:
    """Requirement specifiers of a requirements file or a tox `deps` value: comments, options,
    URLs, paths, editable installs, tox substitutions and tox's conditional lines left out."""
    found = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith(("-", ".", "/")) or "://" in line or "{" in line:
            continue
        if not _TOX_FACTORS.match(line):
            found.append(line)
    return found


def _config(project: Path, name: str) -> ConfigParser | None:
    """The project's INI-style configuration file `name` (setup.cfg, tox.ini), parsed; None where
    it has none or it does not parse."""
    path = project / name
    if not path.is_file():
        return None
    parser = ConfigParser(interpolation=None)
    try:
        parser.read_string(path.read_text(errors="replace"))
    except ConfigError:
        return None
    return parser


def declared_dependencies(project: Path) -> list[str]:
    """The requirement specifiers the project declares: pyproject's [project].dependencies,
    setup.cfg's `[options] install_requires`, setup.py's literal `install_requires=[...]` (read,
    never run: asttokens 2.4.1 declares `six` in setup.cfg alone), then requirements.txt's lines;
    without options, URLs or editable installs."""
    found = [
        d for d in read_pyproject(project).get("project", {}).get("dependencies", []) if isinstance(d, str)
    ]
    setup_cfg = _config(project, "setup.cfg")
    if setup_cfg is not None:
        found += _requirement_lines(setup_cfg.get("options", "install_requires", fallback=""))
    literal = setup_literal(project / "setup.py", "install_requires")
    found += [d for d in literal if isinstance(d, str)] if isinstance(literal, list | tuple) else []
    requirements = project / "requirements.txt"
    if requirements.is_file():
        found += _requirement_lines(requirements.read_text(errors="replace"))
    return list(dict.fromkeys(found))


_SCRIPT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SCRIPT_TARGET = re.compile(r"^([A-Za-z_][\w.]*)\s*:\s*([A-Za-z_][\w.]*)\s*(\[[^\]]*\])?$")


def console_scripts(project: Path) -> dict[str, str]:
    """The console scripts the project declares, name -> `module:attr`, as `pip install -e .`
    puts them on a developer's PATH: pyproject's [project.scripts], setup.cfg's
    `[options.entry_points] console_scripts`, setup.py's literal `entry_points=`. python-dotenv
    1.0.1's CLI tests run `dotenv` in a subprocess. Names and targets that are not plain
    identifiers are left out."""
    found: dict[str, str] = {}
    scripts = read_pyproject(project).get("project", {}).get("scripts", {})
    pairs = list(scripts.items()) if isinstance(scripts, dict) else []
    setup_cfg = _config(project, "setup.cfg")
    lines = setup_cfg.get("options.entry_points", "console_scripts", fallback="") if setup_cfg else ""
    literal = setup_literal(project / "setup.py", "entry_points")
    if isinstance(literal, dict) and isinstance(literal.get("console_scripts"), list | tuple):
        lines += "\n" + "\n".join(str(line) for line in literal["console_scripts"])
    pairs += [
        tuple(part.strip() for part in line.split("=", 1)) for line in lines.splitlines() if "=" in line
    ]
    for name, target in pairs:
        matched = _SCRIPT_TARGET.match(target) if isinstance(target, str) else None
        if isinstance(name, str) and _SCRIPT_NAME.match(name) and matched:
            found.setdefault(name, f"{matched.group(1)}:{matched.group(2)}")
    return found


def _key(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _group(groups: dict, name: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """A PEP 735 dependency group's specifiers, its `include-group` entries followed."""
    found: list[str] = []
    for entry in groups.get(name, []) if name not in seen else []:
        if isinstance(entry, str):
            found.append(entry)
        elif isinstance(entry, dict) and isinstance(entry.get("include-group"), str):
            found += _group(groups, entry["include-group"], seen | {name})
    return found


# What a Poetry "dev" group holds beside the tests' dependencies: tools no test imports, left out
# (tomlkit's dev group: pytest, pytest-cov, PyYAML, pre-commit, mypy, Sphinx, furo).
DEV_TOOLS = re.compile(
    r"(mypy|pre-commit|sphinx.*|furo|black|ruff|flake8.*|isort|pylint|tox|nox|twine|build|mkdocs.*|types-.*)",
    re.IGNORECASE,
)


def _poetry_dev(data: dict) -> list[str]:
    """The distributions Poetry's test groups (`[tool.poetry.group.test.dependencies]`, the
    groups named test/tests/testing/dev, and the older `[tool.poetry.dev-dependencies]`) name,
    by name only: Poetry's constraints (`^7.2`) are not PEP 440, and pip is constrained to our
    test runner anyway. Tools no test imports (DEV_TOOLS) are left out."""
    poetry = data.get("tool", {}).get("poetry", {})
    poetry = poetry if isinstance(poetry, dict) else {}
    groups = poetry.get("group", {}) if isinstance(poetry.get("group"), dict) else {}
    tables = [groups[n].get("dependencies") for n in (*TEST_GROUPS, "dev") if isinstance(groups.get(n), dict)]
    tables.append(poetry.get("dev-dependencies"))
    names = [n for table in tables if isinstance(table, dict) for n in table if isinstance(n, str)]
    return [n for n in names if _NAME.fullmatch(n) and n.lower() != "python" and not DEV_TOOLS.fullmatch(n)]


def declared_test_dependencies(project: Path) -> list[str]:
    """The requirement specifiers the project declares for its tests: the dependency group
    (PEP 735), PDM's dev-dependencies group (cattrs) and the extra (pyproject, setup.cfg) named
    test, tests or testing, Poetry's test
    and dev groups (`_poetry_dev`), and tox.ini's `[testenv]` deps (a `-r FILE` there read when
    FILE is in the project); pytest and what it requires never (the test runner is ours)."""
    found: list[str] = []
    data = read_pyproject(project)
    groups = data.get("dependency-groups", {})
    groups = groups if isinstance(groups, dict) else {}
    extras = data.get("project", {}).get("optional-dependencies", {})
    extras = extras if isinstance(extras, dict) else {}
    pdm = data.get("tool", {}).get("pdm", {})
    pdm = pdm.get("dev-dependencies", {}) if isinstance(pdm, dict) else {}
    for name in TEST_GROUPS:
        found += _group(groups, name)
        found += _group(pdm if isinstance(pdm, dict) else {}, name)
        found += [d for d in extras.get(name, []) if isinstance(d, str)]
    found += _poetry_dev(data)
    configs = (("setup.cfg", "options.extras_require", None), ("tox.ini", "testenv", "deps"))
    for config, section, key in configs:
        parser = _config(project, config)
        if parser is None or not parser.has_section(section):
            continue
        for name in [key] if key else TEST_GROUPS:
            value = parser.get(section, name, fallback="")
            found += _requirement_lines(value)
            for included in re.findall(r"^\s*-r\s*(\S+)", value, re.MULTILINE):
                target = (project / included.replace("{toxinidir}/", "")).resolve()
                if target.is_file() and target.is_relative_to(project.resolve()):
                    found += _requirement_lines(target.read_text(errors="replace"))
    runner = {_key(d.metadata["Name"]) for d in _distribution_closure(TEST_RUNNER)}
    return [d for d in dict.fromkeys(found) if (m := _NAME.match(d)) and _key(m.group(1)) not in runner]


def _distribution_closure(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The installed distributions `names` and everything they require (no extras)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    pending = list(names)
    while pending:
        name = pending.pop()
        key = _key(name)
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


def _pip_install(target: Path, wanted: list[str], constraints: Path) -> None:
    """pip installs `wanted` into `target`, wheels only, the test runner held at our versions."""
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check"]
    argv += ["--only-binary", ":all:", "--no-compile", "--constraint", str(constraints)]
    argv += ["--target", str(target), "--", *wanted]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, cwd=target)
    except subprocess.TimeoutExpired as exc:
        raise DependencyError(f"pip install took over {PIP_TIMEOUT_S} s: {wanted}") from exc
    if done.returncode != 0:  # pip's warnings (an index location it skips) would fill the tail
        said = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("WARNING: "))
        raise DependencyError(f"pip install {' '.join(wanted)} failed: {said.strip()[-1500:]}")


# pip's words for a requirement that no wheel here meets (zipp's `big-O` has an sdist only)
_UNMET = re.compile(r"No matching distribution found for ([A-Za-z0-9][A-Za-z0-9._-]*)")


def unpinned(requirement: str) -> str:
    """`requirement` without its version specifier (its extras and marker kept); as given where
    it does not parse."""
    try:
        parsed = Requirement(requirement)
    except InvalidRequirement:
        return requirement
    parsed.specifier = SpecifierSet()
    return str(parsed)


def _install(target: Path, wanted: list[str], tests: list[str], constraints: Path, status: dict) -> list[str]:
    """The project's dependencies with its test dependencies, by pip's answers:
    - a test dependency that no wheel meets is left out by name, with pip's reason, and the
      others are installed (zipp's test extra names `big-O` beside the `jaraco.*` its tests import);
    - where pip's reason names none (pins it cannot meet together), every requirement is tried
      once more without its version: a lock file's pins were resolved for the project's own pytest
      and pluggy, which ours replace (blinker 1.8.2 pins `pytest-asyncio==0.23.6`, which requires
      pytest < 9; glom 23.5.0's requirements.txt pins `tox==3.7.0`, which requires pluggy < 1);
    - if that fails too, the test dependencies are left out whole and the package's own
      dependencies are installed without them (a `DependencyError` if those fail).
    Returns the requirements installed, the project's then its tests' (`status` says the rest)."""
    left_out: list[str] = []
    while wanted or tests:
        try:
            _pip_install(target, [*wanted, *tests], constraints)
            break
        except DependencyError as exc:
            unmet = _UNMET.search(str(exc))
            drop = [t for t in tests if unmet and _key(_NAME.match(t).group(1)) == _key(unmet.group(1))]
            if drop:
                left_out.append(f"{', '.join(drop)}: no wheel meets it (pip: {unmet.group(0)})")
                tests = [t for t in tests if t not in drop]
                continue
            relaxed = [list(dict.fromkeys(map(unpinned, r))) for r in (wanted, tests)]
            if relaxed != [wanted, tests]:
                said = (str(exc).strip().splitlines() or [""])[-1][:400]  # pip (--quiet): its last line
                left_out.append(f"versions left out: pip could not meet them together (pip: {said})")
                wanted, tests = relaxed
                continue
            if not tests:
                raise
            left_out.append(str(exc))
            tests = []
    status["installed"], status["error"] = tests, "; ".join(left_out)
    return [*wanted, *tests]


def environment_status(env: Path) -> dict:
    """What became of the project's test dependencies in environment `env`: {"installed":
    [specifiers], "error": pip's reason they were left out, or "", "own_removed": [the project's
    own modules a dependency brought, removed], "generated": [files written into the checkout:
    version modules (`write_version_files`), compiled catalogs (`write_catalogs`)]}."""
    try:
        found = json.loads((env / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return dict(_NO_STATUS)
    return {**_NO_STATUS, **found} if isinstance(found, dict) else dict(_NO_STATUS)


def own_names(project: Path) -> set[str]:
    """The top-level modules and packages the project holds (at its root and in `src/`), as the
    boundary tells the repository's code (`boundary.repository_names`), less `setup` (its build
    script, never its code)."""
    return set(repository_names([str(project), str(project / "src")], [], ())) - {"setup"}


def _drop_own(project: Path, target: Path) -> list[str]:
    """Removes from environment `target` the project's own modules that a dependency brought
    (freezegun requires python-dateutil, hypothesis attrs): the environment comes before the
    repository on the path, so that copy, not the repository's code, would be what the tests
    import and judge. Their dist-info folders go too. Returns the names removed."""
    own = own_names(project)
    gone = [e for e in target.iterdir() if e.name.split(".")[0] in own and not e.name.endswith(".dist-info")]
    for entry in gone:
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    removed = {e.name.split(".")[0] for e in gone}
    for info in list(target.glob("*.dist-info")):
        record = info / "RECORD"
        files = record.read_text(errors="replace").splitlines() if record.is_file() else []
        tops = {f.split(",")[0].split("/")[0].split(".")[0] for f in files} - {info.name.split(".")[0], ""}
        if tops and tops <= removed | {"..", "__pycache__"}:
            shutil.rmtree(info)
    return sorted(removed)


def build_environment(project: Path, target: Path, extra: str = "") -> list[str]:
    """Fills `target` (made here) with the test runner and the project's dependencies, its test
    dependencies where they install, and writes the version modules and compiled catalogs the
    project's build would generate into the checkout at `project`; returns what was installed from
    the index (empty: nothing needed the network)."""
    target.mkdir(parents=True, exist_ok=False)
    runner = _distribution_closure(TEST_RUNNER)
    for dist in runner:
        _copy_distribution(dist, target)
    constraints = target / ".fleet-constraints.txt"
    constraints.write_text("".join(f"{d.metadata['Name']}=={d.version}\n" for d in runner))
    wanted = [*declared_dependencies(project), *shlex.split(extra)]
    tests = [d for d in declared_test_dependencies(project) if d not in wanted]
    generated = [*write_version_files(project, read_pyproject(project)), *write_catalogs(project)]
    status: dict = {**_NO_STATUS, "generated": generated}
    try:
        installed = _install(target, wanted, tests, constraints, status)
    finally:
        constraints.unlink()
    status["own_removed"] = _drop_own(project, target)
    (target / STATUS_FILE).write_text(json.dumps(status))
    for directory, _dirs, files in os.walk(target):
        os.chmod(directory, 0o555)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o444)
    return installed
