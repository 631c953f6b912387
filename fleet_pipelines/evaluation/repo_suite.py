"""A suite of small repositories, generated here: each has a real bug, a visible test that fails
on it, tests that pass, hidden tests (the task's `tests`), and the fix as a unified diff (the
reference a test or the evaluation's oracle arm uses). `create_repo` writes one as a git
repository with one commit; a task points at it by path.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ..domain.models import RepoSpec


@dataclass(frozen=True)
class RepoCase:
    name: str
    description: str
    files: dict[str, str]
    fix: str  # the unified diff that fixes the bug
    hidden_tests: str


def _d(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


REPO_CASES: tuple[RepoCase, ...] = (
    RepoCase(
        name="calc-add",
        description="tests/test_calc.py::test_add fails: `add` in calc.py subtracts. Fix it.",
        files={
            "calc.py": _d('''
                """Tiny arithmetic."""


                def add(a, b):
                    return a - b


                def mul(a, b):
                    return a * b
                '''),
            "tests/test_calc.py": _d("""
                from calc import add, mul


                def test_add():
                    assert add(2, 3) == 5


                def test_mul():
                    assert mul(2, 3) == 6
                """),
        },
        fix=_d("""
            --- a/calc.py
            +++ b/calc.py
            @@ -2,7 +2,7 @@
             
             
             def add(a, b):
            -    return a - b
            +    return a + b
             
             
             def mul(a, b):
            """),
        hidden_tests=_d("""
            from calc import add, mul


            def test_add_negative():
                assert add(-2, -3) == -5


            def test_mul_zero():
                assert mul(7, 0) == 0
            """),
    ),
    RepoCase(
        name="text-slug",
        description="tests/test_text.py::test_slug_spaces fails: `slug` in text.py keeps spaces. Fix it.",
        files={
            "text.py": _d('''
                """Text helpers."""


                def slug(title):
                    return title.strip().lower()


                def shout(text):
                    return text.upper() + "!"
                '''),
            "tests/test_text.py": _d("""
                from text import shout, slug


                def test_slug_spaces():
                    assert slug(" Hello World ") == "hello-world"


                def test_shout():
                    assert shout("hi") == "HI!"
                """),
        },
        fix=_d("""
            --- a/text.py
            +++ b/text.py
            @@ -2,7 +2,7 @@
             
             
             def slug(title):
            -    return title.strip().lower()
            +    return "-".join(title.strip().lower().split())
             
             
             def shout(text):
            """),
        hidden_tests=_d("""
            from text import slug


            def test_slug_many_spaces():
                assert slug("a  b   c") == "a-b-c"
            """),
    ),
    RepoCase(
        name="stats-mean",
        description="tests/test_stats.py::test_mean fails: `mean` in stats.py divides by the wrong "
        "count. Fix it.",
        files={
            "stats.py": _d('''
                """Statistics."""


                def mean(values):
                    return sum(values) / (len(values) + 1)


                def total(values):
                    return sum(values)
                '''),
            "tests/test_stats.py": _d("""
                from stats import mean, total


                def test_mean():
                    assert mean([1, 2, 3]) == 2


                def test_total():
                    assert total([1, 2, 3]) == 6
                """),
        },
        fix=_d("""
            --- a/stats.py
            +++ b/stats.py
            @@ -2,7 +2,7 @@
             
             
             def mean(values):
            -    return sum(values) / (len(values) + 1)
            +    return sum(values) / len(values)
             
             
             def total(values):
            """),
        hidden_tests=_d("""
            from stats import mean


            def test_mean_single():
                assert mean([4]) == 4
            """),
    ),
)


def git_commit_all(path: Path, message: str) -> str:
    """Commits every file of `path` (a git repository) with a fixed author; returns the commit."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(path),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "fleet",
        "GIT_AUTHOR_EMAIL": "fleet@example.invalid",
        "GIT_COMMITTER_NAME": "fleet",
        "GIT_COMMITTER_EMAIL": "fleet@example.invalid",
    }
    for argv in (["add", "-A"], ["commit", "--quiet", "--no-verify", "-m", message]):
        subprocess.run(["git", "-C", str(path), *argv], check=True, env=env, capture_output=True)
    return subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], check=True, env=env, capture_output=True, text=True
    ).stdout.strip()


def create_repo(case: RepoCase, path: Path) -> Path:
    """`case` as a git repository at `path` (made here) with one commit on `main`."""
    path.mkdir(parents=True)
    subprocess.run(
        ["git", "init", "--quiet", "--initial-branch", "main", "--template=", str(path)],
        check=True,
        capture_output=True,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
        },
    )
    for name, text in case.files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git_commit_all(path, f"{case.name}: the buggy version")
    return path


def repo_task_fields(case: RepoCase, repo_path: Path, agents: int = 3, rounds: int = 0) -> dict:
    """The flat fields of a DEV task on `case` checked out from `repo_path`."""
    return {
        "description": case.description,
        "role": "DEV",
        "num_agents": agents,
        "rounds": rounds,
        "tests": case.hidden_tests,
        "repo": RepoSpec(url=str(repo_path), ref="main").model_dump(),
    }
