"""Repository tasks made from real projects: a pinned, hash-checked PyPI sdist with a bug put in
(a one-line change that 1-3 of the project's own tests catch), as SWE-smith makes task
instances. Real projects show what generated five-line repositories hide: modules of thousands
of lines, packaging folders (`*.egg-info`), suites of hundreds of tests.

`project_repo` writes a task as a git repository with one commit (the buggy version), from the
pinned sdist (`sdists`).
`touches_function` says whether a patch changes the buggy function's lines.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from ..domain.models import RepoSpec
from ..domain.python_ast import parse_module
from .sdists import PinnedSdist, fetch, unpack_repo

INFLECTION = PinnedSdist(
    "inflection", "0.5.1", "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417"
)
SIX = PinnedSdist("six", "1.16.0", "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926")
MORE_ITERTOOLS = PinnedSdist(
    "more-itertools", "10.5.0", "5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6"
)


@dataclass(frozen=True)
class ProjectTask:
    """A bug put into a project: `old` (one line of `path`, found once) becomes `new`, inside
    `function`; `failing` are the project's tests that catch it."""

    name: str
    sdist: PinnedSdist
    path: str
    old: str
    new: str
    function: str
    test_command: str
    failing: tuple[str, ...]
    description: str


_SIX_TESTS = "python -m pytest -q -p no:cacheprovider test_six.py -k 'not dbm_ndbm'"  # no dbm.ndbm here
PROJECT_TASKS: tuple[ProjectTask, ...] = (
    ProjectTask(
        name="inflection-underscore",
        sdist=INFLECTION,
        path="inflection/__init__.py",
        old="    word = re.sub(r\"([A-Z]+)([A-Z][a-z])\", r'\\1_\\2', word)",
        new="    word = re.sub(r\"([A-Z]+)([A-Z][a-z])\", r'\\1\\2', word)",
        function="underscore",
        test_command="python -m pytest -q -p no:cacheprovider test_inflection.py",
        failing=(
            "test_inflection.py::test_underscore[HTMLTidy-html_tidy]",
            "test_inflection.py::test_underscore[HTMLTidyGenerator-html_tidy_generator]",
        ),
        description='test_underscore fails for acronyms: underscore("HTMLTidy") should be '
        '"html_tidy" but the acronym is not split from the next word. Fix the bug.',
    ),
    ProjectTask(
        name="inflection-dasherize",
        sdist=INFLECTION,
        path="inflection/__init__.py",
        old="    return word.replace('_', '-')",
        new="    return word.replace('_', ' ')",
        function="dasherize",
        test_command="python -m pytest -q -p no:cacheprovider test_inflection.py",
        failing=(
            "test_inflection.py::test_dasherize[street_address-street-address]",
            "test_inflection.py::test_dasherize[person_street_address-person-street-address]",
        ),
        description='test_dasherize fails: dasherize("puni_puni") should be "puni-puni" '
        "(underscores become dashes). Fix the bug.",
    ),
    ProjectTask(
        name="six-iteritems",
        sdist=SIX,
        path="six.py",
        old="        return iter(d.items(**kw))",
        new="        return iter(d.keys(**kw))",
        function="iteritems",
        test_command=_SIX_TESTS,
        failing=("test_six.py::test_dictionary_iterators",),
        description="test_dictionary_iterators fails: six.iteritems(d) should iterate over the "
        "dictionary's (key, value) pairs. Fix the bug.",
    ),
    ProjectTask(
        name="six-b",
        sdist=SIX,
        path="six.py",
        old='        return s.encode("latin-1")',
        new='        return s.encode("utf-8")',
        function="b",
        test_command=_SIX_TESTS,
        failing=("test_six.py::test_b",),
        description='test_b fails: six.b("\\xff") should be the one byte b"\\xff" (a byte '
        "literal, each character one byte). Fix the bug.",
    ),
    ProjectTask(
        name="more-itertools-polynomial-derivative",
        sdist=MORE_ITERTOOLS,
        path="more_itertools/recipes.py",
        old="    powers = reversed(range(1, n))",
        new="    powers = range(1, n)",
        function="polynomial_derivative",
        test_command="python -m pytest -q -p no:cacheprovider tests/test_recipes.py",
        failing=("tests/test_recipes.py::PolynomialDerivativeTests",),
        description="PolynomialDerivativeTests fail: polynomial_derivative([1, -4, -17, 60]) "
        "should be [3, -8, -17]. Fix the bug.",
    ),
    ProjectTask(
        name="more-itertools-chunked-even",
        sdist=MORE_ITERTOOLS,
        path="more_itertools/more.py",
        old="    partial_size = full_size - 1",
        new="    partial_size = full_size",
        function="chunked_even",
        test_command="python -m pytest -q -p no:cacheprovider tests/test_more.py",
        failing=(
            "tests/test_more.py::ChunkedEvenTests::test_5",
            "tests/test_more.py::ChunkedEvenTests::test_evenness",
        ),
        description="ChunkedEvenTests fail: chunked_even(range(10), 3) should give chunks of "
        "lengths 4, 3, 3. Fix the bug.",
    ),
)


def project_repo(task: ProjectTask, path: Path) -> Path:
    """The task as a git repository at `path` (made here): the sdist's files with the bug put
    in, one commit on `main`."""
    bug = (task.path, task.old, task.new)
    return unpack_repo(fetch(task.sdist), path, bug, f"{task.name}: the buggy version")


def project_task_fields(task: ProjectTask, repo_path: Path, agents: int = 2, rounds: int = 0) -> dict:
    """The flat fields of a DEV task on `task` checked out from `repo_path`."""
    return {
        "description": task.description,
        "role": "DEV",
        "num_agents": agents,
        "rounds": rounds,
        "repo": RepoSpec(url=str(repo_path), ref="main", test_command=task.test_command).model_dump(),
    }


def function_lines(text: str, name: str) -> tuple[int, int]:
    """The first and last line of the (first) function `name` defined in `text`."""
    for node in ast.walk(parse_module(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node.lineno, node.end_lineno or node.lineno
    raise ValueError(f"no function {name!r}")


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? ", re.MULTILINE)


def touches_function(patch: str, task: ProjectTask, buggy_text: str) -> bool:
    """Whether `patch` changes lines of the buggy function in the task's file."""
    first, last = function_lines(buggy_text, task.function)
    for section in re.split(r"^diff --git |^(?=--- )", patch, flags=re.MULTILINE):
        if f"+++ b/{task.path}" not in section and f"+++ {task.path}" not in section:
            continue
        for match in _HUNK.finditer(section):
            start, count = int(match.group(1)), int(match.group(2) or 1)
            if start <= last and start + max(count, 1) - 1 >= first:
                return True
    return False


def reached_model(task: ProjectTask, texts: list[str]) -> bool:
    """Whether the buggy line (as the model sees it: bare, or numbered by read_file) is in any
    of `texts` (the prompt, the tool results)."""
    line = task.new.strip().splitlines()[0]
    return any(line in t for t in texts)


def main(argv: list[str] | None = None) -> None:
    """`python -m fleet_pipelines.evaluation.project_tasks NAME DEST`: the task NAME as a git
    repository at DEST, and the `fleet run` that gives it to a council."""
    import argparse
    import shlex

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("name", choices=[t.name for t in PROJECT_TASKS])
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    task = next(t for t in PROJECT_TASKS if t.name == args.name)
    repo = project_repo(task, args.dest)
    print(f"{repo}: {task.sdist.name} {task.sdist.version} with a bug in {task.function} ({task.path})")
    print(
        f"fleet run {shlex.quote(task.description)} --repo {shlex.quote(str(args.dest))} --ref main "
        f"--test-command {shlex.quote(task.test_command)} --agents 2 --rounds 0"
    )


if __name__ == "__main__":
    main()
