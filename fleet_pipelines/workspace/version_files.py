"""The version module a project's build backend generates, written into the checkout.

Projects versioned by their tags (setuptools-scm, hatch-vcs) import a module their build writes
(`from ._version import __version__`), which a checkout lacks (their .gitignore names it): without
it every test module fails to import and nothing can be judged (humanize 4.11.0, isodate 0.7.2). The
judge never runs a build backend, so the module is written from the configuration alone:
- `[tool.setuptools_scm]` `version_file` or `write_to` (template: `version_file_template`,
  `write_to_template`);
- `[tool.hatch.build.hooks.vcs]` `version-file` (template: `template`);
- setup.py's `setup(use_scm_version={...})`, where it is a literal (read with `ast`, never run).

The version is the sdist's (`PKG-INFO`), else the configured `fallback_version`, else `0.0.0`:
the checkout has no tags to derive one from. A file the checkout has is left alone; a path outside
the project, through a symbolic link or into a folder the checkout lacks is not written (said so).
A computed `use_scm_version` and other backends (pdm's `write_to`) are not read.
"""

from __future__ import annotations

import ast
import os
import re
import string
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from ..domain.python_ast import parse_module

DEFAULT_VERSION = "0.0.0"
_TEMPLATE_MAX_CHARS = 8_000
_PYTHON_TEMPLATE = (
    "# Written by fleet_pipelines where the build backend would have written it: the checkout has none.\n"
    "__version__ = version = {version!r}\n"
    "__version_tuple__ = version_tuple = {version_tuple!r}\n"
)


@dataclass(frozen=True)
class VersionFile:
    """A version module the build would write: where (relative to the project), with which
    template, and which configuration asked for it."""

    path: str
    template: str
    source: str


def _table(data: dict, *keys: str) -> dict:
    """The table at `keys` in parsed TOML; {} where a key is missing or not a table."""
    for key in keys:
        data = data.get(key, {})
        if not isinstance(data, dict):
            return {}
    return data


def setup_literal(setup_py: Path, keyword: str) -> object:
    """The value of `keyword` in the `setup()` call of setup.py, read as a literal (never run);
    None where there is none, it is computed, or the file does not parse."""
    try:
        tree = parse_module(setup_py.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "setup":
            for given in node.keywords:
                if given.arg == keyword:
                    try:
                        return ast.literal_eval(given.value)
                    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                        return None
    return None


def _setup_scm(setup_py: Path) -> dict:
    """`use_scm_version={...}` of setup.py's `setup()` call; {} where it is no literal table."""
    found = setup_literal(setup_py, "use_scm_version")
    return found if isinstance(found, dict) else {}


def _configured(pyproject: dict, setup_scm: dict) -> tuple[list[VersionFile], list[str]]:
    """The version files the configuration asks for, and its fallback versions."""
    scm = _table(pyproject, "tool", "setuptools_scm")
    hook = _table(pyproject, "tool", "hatch", "build", "hooks", "vcs")
    raw = _table(pyproject, "tool", "hatch", "version", "raw-options")
    wanted = [
        (scm.get("version_file"), scm.get("version_file_template"), "tool.setuptools_scm.version_file"),
        (scm.get("write_to"), scm.get("write_to_template"), "tool.setuptools_scm.write_to"),
        (hook.get("version-file"), hook.get("template"), "tool.hatch.build.hooks.vcs.version-file"),
        (setup_scm.get("version_file"), setup_scm.get("version_file_template"), "setup.py's use_scm_version"),
        (setup_scm.get("write_to"), setup_scm.get("write_to_template"), "setup.py's use_scm_version"),
    ]
    files = [
        VersionFile(path, template if isinstance(template, str) else "", source)
        for path, template, source in wanted
        if isinstance(path, str) and path
    ]
    fallbacks = [
        f
        for f in (scm.get("fallback_version"), raw.get("fallback_version"), setup_scm.get("fallback_version"))
        if isinstance(f, str)
    ]
    return files, fallbacks


def _version(project: Path, fallbacks: list[str]) -> str:
    pkg_info = project / "PKG-INFO"
    if pkg_info.is_file() and not pkg_info.is_symlink():
        version = HeaderParser().parsestr(pkg_info.read_text(errors="replace")).get("Version", "").strip()
        if version:
            return version
    return fallbacks[0] if fallbacks else DEFAULT_VERSION


def version_tuple(version: str) -> tuple[int | str, ...]:
    """setuptools-scm's tuple of a version: its dot- and plus-separated parts, numbers as ints."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+]", version) if p)


def _target(project: Path, relative: str) -> Path | str | None:
    """Where `relative` lands inside `project`; None: the checkout has that file; else why it is
    not written (outside the project, through a link, into a folder the checkout lacks)."""
    path = PurePosixPath(relative)
    if not path.parts or path.is_absolute() or ".." in path.parts:
        return "outside the project"
    where = project
    for part in path.parts[:-1]:
        where = where / part
        if where.is_symlink() or not where.is_dir():
            return f"{where.relative_to(project)} is a link or not a folder of the checkout"
    target = where / path.parts[-1]
    return None if os.path.lexists(target) else target


def write_generated(target: Path, data: bytes) -> None:
    """Writes a file the build would generate into the read-only checkout, read-only itself."""
    mode = target.parent.stat().st_mode
    os.chmod(target.parent, mode | 0o200)
    try:
        target.write_bytes(data)
        os.chmod(target, 0o444)
    finally:
        os.chmod(target.parent, mode)


def _refused(template: str) -> str:
    """Why a template is not filled, or "": only `{version}` and `{version_tuple}` (`!r`, `!s`)
    are, with no format spec (a width could make the host build gigabytes of padding)."""
    if len(template) > _TEMPLATE_MAX_CHARS:
        return f"is over {_TEMPLATE_MAX_CHARS} characters"
    try:
        fields = [f for f in string.Formatter().parse(template) if f[1] is not None]
    except ValueError as error:
        return f"does not parse: {error}"
    for _text, name, spec, conversion in fields:
        if name not in ("version", "version_tuple") or spec or conversion not in (None, "r", "s"):
            field = f"{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}"
            return f"uses {{{field}}}: only {{version}} and {{version_tuple}} are filled"
    return ""


def write_version_files(project: Path, pyproject: dict) -> list[str]:
    """Writes the version modules the project's build would generate and the checkout lacks
    (`pyproject`: its pyproject.toml as data); one line for each (its path relative to `project`,
    the version, the setting that asks for it), or why it was not written."""
    files, fallbacks = _configured(pyproject, _setup_scm(project / "setup.py"))
    version = _version(project, fallbacks)
    written = []
    for file in files:
        target = _target(project, file.path)
        if target is None:
            continue
        if isinstance(target, str):
            written.append(f"{file.path}: not written ({file.source}): {target}")
            continue
        template = file.template or (_PYTHON_TEMPLATE if target.suffix == ".py" else "{version}\n")
        refused = _refused(template)
        if refused:
            written.append(f"{file.path}: not written, its template ({file.source}) {refused}")
            continue
        write_generated(
            target, template.format(version=version, version_tuple=version_tuple(version)).encode()
        )
        written.append(f"{file.path} (version {version}, as {file.source} asks)")
    return written
