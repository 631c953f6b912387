"""A repository as a council sees it: the checked-out workspace, its file index, test evidence,
and proposals that are patches (a unified diff plus its rationale).

Pure: what `fleet_pipelines.workspace` (git, the sandbox) produces and what scoring reads.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_PATCH_CHARS = 200_000  # a proposal's patch beyond this is not applied (scored as not applying)
INLINE_PATCH_CHARS = 16_000  # what an event carries inline; the full patch is in storage
MAX_INDEX_ENTRIES = 5_000  # files listed in the stored workspace (all are counted)

_LANGUAGES = {
    ".py": "python",
    ".pyi": "python",
    ".md": "markdown",
    ".rst": "rst",
    ".txt": "text",
    ".toml": "toml",
    ".cfg": "ini",
    ".ini": "ini",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".js": "javascript",
    ".ts": "typescript",
    ".go": "go",
    ".rs": "rust",
    ".c": "c",
    ".h": "c",
    ".cpp": "cpp",
    ".java": "java",
    ".sh": "shell",
    ".html": "html",
    ".css": "css",
}


def excerpt(text: str, limit: int = 1_500) -> str:
    """`text` within `limit` characters: whole, else its head and its tail (where a failure's
    cause and its last frames are) around a cut mark."""
    if len(text) <= limit:
        return text
    return text[: limit // 3] + "\n...\n" + text[-(2 * limit) // 3 :]


def language_of(path: str) -> str:
    """The language a file's name says (by extension; Dockerfile and Makefile by name)."""
    name = PurePosixPath(path).name
    if name == "Dockerfile":
        return "dockerfile"
    if name == "Makefile":
        return "make"
    return _LANGUAGES.get(PurePosixPath(path).suffix.lower(), "other")


class FileEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    size: int
    language: str


class TestEvidence(BaseModel):
    """One run of a test command in the sandbox: counts from pytest's report where it gave one."""

    __test__ = False  # not a pytest class

    status: Literal["passed", "failed", "timeout", "error", "not_run"]
    ran: str = Field(description="What was run, where.")
    passed: int = 0
    failed: int = 0  # failures and errors
    skipped: int = 0
    failing: list[str] = Field(default_factory=list, description="Failing test ids (at most 50).")
    first_failure: str = ""
    output: str = ""  # an excerpt
    duration_s: float = 0.0
    counted: bool = False  # the counts come from pytest's report (else only the exit status)
    forgeable: bool = False  # ran in the code under test's own process: it could write the result
    cannot_cross: list[str] = Field(
        default_factory=list,
        description="Tests that cannot be judged across the boundary (found on the base commit): "
        "they compare an object of the code under test that holds no plain value, or hand the "
        "code what cannot cross; listed and left out.",
    )
    not_counted: int = 0  # failing, skipped or xfailed on the base, or not the base's (the patch's own)
    flaky: list[str] = Field(
        default_factory=list, description="Outcome differed between two base runs: listed, left out."
    )
    contradicted: list[str] = Field(
        default_factory=list,
        description="Sampled tests the plain report says passed and the boundary failed: that report "
        "is not trusted.",
    )
    rests_on: str = ""  # what kind of evidence the counts rest on, in words
    base_failing: int = 0  # the base's failing tests, re-run across the boundary (not counted)
    base_failing_passed: int = 0  # of those, how many pass across the boundary after the patch
    fail_to_pass: int = 0  # of the base's failing tests, those the task names: counted
    fail_to_pass_passed: int = 0  # of those, how many pass across the boundary after the patch
    executed: dict[str, dict[str, list[tuple[int, int]]]] = Field(
        default_factory=dict,
        description="The code's lines each failing test executed on this commit (test id -> path -> "
        "ranges, first to last), traced in the sandbox (at most 10 tests; bounded: "
        "repomap.executed_ranges).",
    )

    @property
    def total(self) -> int:
        return self.passed + self.failed


class PatchEvidence(BaseModel):
    """A patch scored in a fresh sandboxed copy of the workspace: applied, tests, ruff, hidden tests."""

    applies: bool
    apply_output: str = ""
    changed_files: list[str] = Field(default_factory=list)
    touches_tests: bool = False
    flags: list[str] = Field(
        default_factory=list,
        description="What the patch touches that can change how it is judged (tests, conftest.py, "
        "pytest configuration, plugin entry points, standard-library names), each with its path.",
    )
    tests: TestEvidence | None = None  # the repository's test command after the patch
    hidden: TestEvidence | None = None  # the task's hidden tests after the repository's
    ruff_issues: int | None = None
    ruff_output: str = ""
    sandbox_s: float = 0.0
    not_run: str = ""  # why nothing could run (no isolation), else ""


class PushedBranch(BaseModel):
    """What the `winning_branch` step did with the winning patch: the branch it pushed (with the
    commit, to which remote), or why it did not ("" fields: no patch or no remote)."""

    branch: str = ""
    commit: str = ""
    remote: str = ""
    error: str = ""  # the push failed: why

    @property
    def said(self) -> str:
        """One line for a person: where the patch went, or why it did not."""
        if self.branch:
            return f"pushed as {self.branch} ({self.commit[:12]}) to {self.remote}"
        return f"push failed: {self.error}" if self.error else "not pushed"


class Workspace(BaseModel):
    """The checkout at the resolved commit, stored read-only; its index and baseline test result.
    `repo` None: the task names no repository (the partition's workspace is empty)."""

    task_id: str
    url: str = ""
    ref: str = ""
    commit: str = ""
    path: str = ""  # host directory of the read-only checkout
    env_path: str = ""  # host directory of the read-only dependency environment
    subdir: str = ""
    test_command: str = ""
    files: list[FileEntry] = Field(default_factory=list)
    file_count: int = 0
    total_bytes: int = 0
    skipped: list[str] = Field(default_factory=list, description="What was not checked out, and why.")
    dependencies: list[str] = Field(default_factory=list)
    test_dependencies: list[str] = Field(
        default_factory=list, description="The project's declared test dependencies that were installed."
    )
    test_dependencies_error: str = Field(
        default="", description="Why the declared test dependencies were left out (pip's reason), or empty."
    )
    own_removed: list[str] = Field(
        default_factory=list,
        description="The project's own modules a dependency installed, removed from the environment.",
    )
    generated: list[str] = Field(
        default_factory=list,
        description="Files the project's build would generate, written into the checkout, which lacks "
        "them: version modules (setuptools-scm, hatch-vcs: path, version and the setting that asks for "
        "it) and compiled gettext catalogs (`.mo` from `.po`); or why one was not written.",
    )
    baseline: TestEvidence | None = None

    @property
    def active(self) -> bool:
        return bool(self.path)


_DIFF_FENCE = re.compile(r"```[ \t]*(?:diff|patch|udiff)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_DIFF_START = re.compile(r"^(diff --git |--- (?:a/|/dev/null))", re.MULTILINE)
_PATCH_PATH = re.compile(r"^(?:\+\+\+|---) (?:[ab]/)?(\S+)", re.MULTILINE)


def extract_patch(text: str) -> str:
    """The unified diff in a proposal: its ```diff blocks joined, else the text from the first
    `diff --git` / `--- a/` line; "" when it has none. Ends with a newline (git apply needs it)."""
    blocks = [b for b in _DIFF_FENCE.findall(text) if _DIFF_START.search(b)]
    if blocks:
        patch = "".join(b if b.endswith("\n") else b + "\n" for b in blocks)
    else:
        start = _DIFF_START.search(text)
        if start is None:
            return ""
        patch = text[start.start() :]
        if not patch.endswith("\n"):
            patch += "\n"
    return patch


def rationale_of(text: str) -> str:
    """The proposal's words without its diff blocks."""
    return re.sub(r"\n{3,}", "\n\n", _DIFF_FENCE.sub("", text)).strip()


def changed_paths(patch: str) -> list[str]:
    """The files a patch touches (from its ---/+++ lines), in order, without /dev/null."""
    seen: dict[str, None] = {}
    for path in _PATCH_PATH.findall(patch):
        if path != "/dev/null":
            seen[path] = None
    return list(seen)


def doctest_edits(patch: str) -> list[str]:
    """The Python files whose doctest examples a unified diff changes: a removed or added line of
    an example (`>>>`, its `...` lines and its expected output up to a blank line or the
    docstring's end) on that side of a hunk. Doctest text is the tests' (it is judged from the
    base commit), so editing it is editing a test."""
    found: dict[str, None] = {}
    path = ""
    in_example = {"-": False, "+": False}
    for line in patch.splitlines():
        if line.startswith("+++ "):
            path = _PATCH_PATH.match(line).group(1) if _PATCH_PATH.match(line) else ""
            continue
        if line.startswith(("--- ", "diff ", "index ")):
            continue
        if line.startswith("@@"):
            in_example = {"-": False, "+": False}
            continue
        if not line or line[0] not in " -+":
            continue
        sides = "-+" if line[0] == " " else line[0]
        text = line[1:].strip()
        for side in sides:
            if text.startswith(">>>"):
                in_example[side] = True
            elif not text or '"""' in text or "'''" in text:  # a blank line, the docstring's end
                in_example[side] = False
            if line[0] == side and in_example[side] and path.endswith(".py"):
                found[path] = None
    return list(found)


@dataclass(frozen=True)
class FailToPass:
    """What a task says of the base's failing tests: its text and its `fail_to_pass` names. The
    failing tests it names are its fail-to-pass tests (SWE-bench's FAIL_TO_PASS), counted like the
    pass-to-pass ones; the base's other failures neither help nor hurt."""

    text: str = ""
    names: tuple[str, ...] = ()

    def among(self, failing: Iterable[str]) -> list[str]:
        """The failing test ids named: whole (with or without parameters) in the text or the names,
        or by their test function or class, as a word of the text or a name (`test_underscore`
        names every failing `test_inflection.py::test_underscore[...]`, `ChunkedEvenTests` every
        failing test of that class)."""
        given = set(self.names)
        named = []
        for test_id in failing:
            bare = test_id.split("[", 1)[0]
            parts = bare.split("::")[1:]  # the class(es) and the function, not the file
            words = any(re.search(rf"(?<![\w.]){re.escape(p)}(?!\w)", self.text) for p in parts)
            if given & {test_id, bare, *parts} or test_id in self.text or words:
                named.append(test_id)
        return named


def is_test_path(path: str) -> bool:
    name = PurePosixPath(path).name
    return name.startswith("test_") or name.endswith("_test.py") or "tests" in PurePosixPath(path).parts


PYTEST_CONFIG_FILES = frozenset({"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"})
RUNNER_MODULES = frozenset({"sitecustomize", "usercustomize", "pytest", "_pytest", "pluggy", "py"})


def patch_flags(
    paths: list[str],
    subdir: str,
    stdlib: frozenset[str],
    pytest_config: list[str] = (),
    test_side: Collection[str] = (),
    doctests: Collection[str] = (),
) -> list[str]:
    """Why each path a patch changes can change how the patch is judged (empty: none can):
    test files, conftest.py, pytest configuration (`pytest_config`: the configuration files whose
    pytest sections changed), plugin entry points and site configuration (*.dist-info,
    *.egg-info, entry_points.txt, *.pth), modules named like the standard library's or the test
    runner's at a source root (the project root or its src/). `test_side`: the paths of the
    modules the base commit's tests take from the base (their folders' helpers, modules only
    tests import), and `doctests`: the files whose doctest examples changed (`doctest_edits`),
    flagged as test files."""
    flags = []
    root = PurePosixPath(subdir) if subdir else None
    for path in paths:
        pure = PurePosixPath(path)
        parts = pure.parts
        if any(p.endswith((".dist-info", ".egg-info")) for p in parts) or pure.name == "entry_points.txt":
            flags.append(f"{path}: plugin entry points")
        elif pure.suffix == ".pth":
            flags.append(f"{path}: site configuration (.pth)")
        elif pure.name == "conftest.py":
            flags.append(f"{path}: conftest.py")
        elif path in pytest_config:
            flags.append(f"{path}: pytest configuration")
        elif is_test_path(path) or path in test_side or path in doctests:
            flags.append(f"{path}: test file")
        else:
            inside = parts
            if root is not None:
                if parts[: len(root.parts)] != root.parts:
                    continue
                inside = parts[len(root.parts) :]
            if inside and inside[0] == "src":
                inside = inside[1:]
            if not inside:
                continue
            module = inside[0].removesuffix(".py") if len(inside) == 1 else inside[0]
            if len(inside) == 1 and not inside[0].endswith(".py"):
                continue
            if module in stdlib:
                flags.append(f"{path}: named like the standard library's {module!r}")
            elif module in RUNNER_MODULES:
                flags.append(f"{path}: named like the test runner's or site's {module!r}")
    return flags


def bounded_patch(patch: str, limit: int = INLINE_PATCH_CHARS) -> tuple[str, bool]:
    """The patch as an event carries it: whole up to `limit` characters, else cut at a line end
    (True: cut; the full patch is in storage)."""
    if len(patch) <= limit:
        return patch, False
    cut = patch.rfind("\n", 0, limit)
    return patch[: cut + 1 if cut > 0 else limit], True


def workspace_view(workspace: Workspace, repository_map: str) -> str:
    """The repository as the prompts show it: commit, test command and baseline result (the
    failing tests and the first failure), then the repository map (`domain.repomap`)."""
    lines = [f"Repository {workspace.url} at commit {workspace.commit[:12]} ({workspace.ref})."]
    lines.append(f"Test command: {workspace.test_command}")
    base = workspace.baseline
    if base is not None:
        counts = f" ({base.passed} passed, {base.failed} failing)" if base.counted else ""
        lines.append(f"The tests now: {base.status}{counts}.")
        if base.failing:
            lines.append("Failing: " + ", ".join(base.failing[:10]))
        if base.first_failure:
            lines.append(f"First failure:\n{base.first_failure[:800]}")
    lines.append(repository_map)
    return "\n".join(lines)
