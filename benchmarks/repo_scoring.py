"""Repository scoring of one patch: the current verdict against an earlier one, in the same run.

The earlier implementation (fleet_pipelines/workspace/ runs.py and sandbox_job.py as of a commit,
read from git: by default f19dc4c, before the verdict crossed a boundary: the test command and the
hidden tests in process) is loaded as a sibling package of the current one, so both use the same
sandbox, domain models and workspace. For each generated repository (evaluation.repo_suite), one
workspace is prepared, then, alternately, its fixing patch is scored (`score_patch`, with the
hidden tests) by:
  - the earlier implementation;
  - the current one with the plan known (every patch after a workspace's first);
  - the current one planning first (a workspace's first patch: the base commit's sessions run in
    the same job before the patch is applied).
Prints the median and p90 of each and the ratios of the medians to the earlier one's. Asserts
nothing.

Run as root from the repo root: .venv/bin/python benchmarks/repo_scoring.py [runs] [commit] [cases]
"""

from __future__ import annotations

import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fleet_pipelines
from fleet_pipelines.domain.models import RepoSpec
from fleet_pipelines.evaluation.repo_suite import REPO_CASES, create_repo
from fleet_pipelines.workspace import runs
from fleet_pipelines.workspace.checkout import make_writable
from fleet_pipelines.workspace.prepare import prepare_workspace

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
PREVIOUS = sys.argv[2] if len(sys.argv) > 2 else "f19dc4c"
CASES = int(sys.argv[3]) if len(sys.argv) > 3 else 1


def load_previous(where: Path):
    """The earlier runs.py, sandbox_job.py and boundary.py (where that commit has one) as the
    package fleet_pipelines.previous_workspace."""
    repo = Path(__file__).resolve().parents[1]
    package = where / "previous_workspace"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("runs.py", "sandbox_job.py", "boundary.py"):
        shown = subprocess.run(
            ["git", "show", f"{PREVIOUS}:fleet_pipelines/workspace/{name}"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=name != "boundary.py",
        )
        if shown.returncode == 0:
            (package / name).write_text(shown.stdout)
    fleet_pipelines.__path__.append(str(where))
    return importlib.import_module("fleet_pipelines.previous_workspace.runs")


def timed(score_patch, workspace, case) -> float:
    start = time.perf_counter()
    score_patch(workspace, case.fix, case.hidden_tests)
    return time.perf_counter() - start


def summary(name: str, samples: list[float], reference: float) -> str:
    p90 = statistics.quantiles(samples, n=10)[-1] if len(samples) > 1 else samples[0]
    median = statistics.median(samples)
    return (
        f"  {name:<32} median {median * 1000:6.0f} ms   p90 {p90 * 1000:6.0f} ms   "
        f"x{median / reference:.2f} of {PREVIOUS}"
    )


def main() -> None:
    where = Path(tempfile.mkdtemp(prefix="fleet-bench-scoring-"))
    os.chmod(where, 0o755)
    try:
        previous = load_previous(where / "code")
        for case in REPO_CASES[:CASES]:
            source = create_repo(case, where / case.name / "source")
            workspace = prepare_workspace(case.name, RepoSpec(url=str(source)), where / case.name / "ws")
            samples: dict[str, list[float]] = {"previous": [], "current": [], "current, planning": []}
            for _ in range(RUNS):
                samples["previous"].append(timed(previous.score_patch, workspace, case))
                runs._PLANS.clear()
                samples["current, planning"].append(timed(runs.score_patch, workspace, case))
                samples["current"].append(timed(runs.score_patch, workspace, case))
            fixed = runs.score_patch(workspace, case.fix, case.hidden_tests)
            assert fixed.tests and fixed.hidden and fixed.hidden.status == "passed", fixed
            reference = statistics.median(samples["previous"])
            print(f"{case.name}: one patch scored, {RUNS} runs each, alternating")
            for name, values in samples.items():
                print(summary(name, values, reference))
    finally:
        make_writable(where)
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
