"""The judge against its forgeries (issue 40), and what scoring one patch costs.

For each forgery of tests/integration/test_judge_forgeries.py: the tests check's value, the
visible and hidden passes and the flags of the forged patch and of the patch it forges for (the
honest wrong patch, or the regression it hides), judged as root in the real sandbox. Then the
cost of scoring one patch of tests/integration/test_repo_hostile.py's repository (its honest
wrong patch with its hidden tests): the first patch (the base commit's plan in the same job) and
the median of the next `runs` (the plan known).

Whichever `fleet_pipelines` is importable is measured: to measure an earlier tree, export it and
put it first, from a folder that has no fleet_pipelines of its own:
    git archive <commit> fleet_pipelines | tar -x -C /tmp/before
    cd /tmp && PYTHONPATH=/tmp/before:/work/main /work/main/.venv/bin/python \\
        /work/main/benchmarks/judge_forgeries.py [runs] [--json]
Asserts nothing.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import fleet_pipelines
from fleet_pipelines.domain.models import RepoSpec
from fleet_pipelines.workspace.checkout import make_writable
from fleet_pipelines.workspace.prepare import prepare_workspace
from fleet_pipelines.workspace.runs import score_patch
from tests.integration import test_judge_forgeries as forgeries
from tests.integration import test_repo_hostile as hostile

RUNS = int(next((a for a in sys.argv[1:] if a.isdigit()), "5"))


def judged(root: Path, files: dict[str, str], hidden: str) -> hostile.Judged:
    source = hostile.make_repo(root / "src", files)
    workspace = prepare_workspace(
        "judge-bench", RepoSpec(url=str(source)), root / "ws", run_limits=hostile.FORGERY_LIMITS
    )
    return hostile.Judged("root", workspace, True, hidden)


def figures(done: hostile.Judged, patch: str, hidden: str | None = None) -> dict:
    evidence, checks, candidate = done.judge(patch, hidden)
    return {
        "tests_check": checks["tests"].value,
        "visible_passed": evidence.tests.passed if evidence.tests else None,
        "hidden_passed": evidence.hidden.passed if evidence.hidden else None,
        "passed_gate": candidate.passed,
        "flags": evidence.flags,
    }


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="fleet-judge-bench-"))
    root.chmod(0o755)  # the sandbox's own uid reads the workspace
    report: dict = {"fleet_pipelines": str(Path(fleet_pipelines.__file__).parent), "forgeries": {}}
    try:
        done = judged(root / "forgeries", forgeries.FILES, forgeries.HIDDEN)
        bars = {p: figures(done, p) for p in (forgeries.HONEST_WRONG, forgeries.BREAKS_MUL)}
        for name, patch in forgeries.FORGERIES.items():
            bar = bars[forgeries.WITHOUT.get(name, forgeries.HONEST_WRONG)]
            report["forgeries"][name] = {"forged": figures(done, patch), "without": bar}
        contradictory = forgeries.CONTRADICTORY
        report["forgeries"]["state kept across contradictory hidden tests"] = {
            "forged": figures(done, forgeries.STATEFUL, contradictory),
            "without": figures(done, forgeries.HONEST_FIX, contradictory),
        }
        cost = judged(
            root / "cost", {"calc.py": hostile.CALC, "tests/test_calc.py": hostile.VISIBLE}, hostile.HIDDEN
        )
        walls = []
        for _ in range(RUNS + 1):
            start = time.perf_counter()
            score_patch(cost.workspace, hostile.HONEST_WRONG, hostile.HIDDEN, hostile.FORGERY_LIMITS)
            walls.append(time.perf_counter() - start)
        report["cost_s"] = {
            "first_patch": round(walls[0], 3),
            "next_median": round(statistics.median(walls[1:]), 3),
        }
    finally:
        make_writable(root)
        shutil.rmtree(root, ignore_errors=True)
    if "--json" in sys.argv:
        print(json.dumps(report, indent=1))
        return
    print(report["fleet_pipelines"])
    for name, pair in report["forgeries"].items():
        forged, bar = pair["forged"], pair["without"]
        counts = [f"{f['tests_check']} ({f['visible_passed']}/{f['hidden_passed']})" for f in (forged, bar)]
        print(f"{name:<70} forged {counts[0]}  without {counts[1]}  gate {forged['passed_gate']}")
    print("cost of one patch:", report["cost_s"])


if __name__ == "__main__":
    main()
