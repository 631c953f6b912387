"""The repository judge on real projects: pinned, hash-checked PyPI sdists, prepared as
`fleet run --repo` prepares a repository (a git checkout, its dependency environment, the
baseline), then scored as a council's patches are (`score_patch`, `evidence_checks`, the gate).

Per repository:
  - the test ids plain pytest passes (pytest on the unpacked sdist on the host, with the
    workspace's dependency environment; ids from pytest's own node ids);
  - the test ids the judge passes on a comment patch, and the ids plain pytest passes that the
    judge does not (with their count);
  - the walls: plain pytest, the first patch's job (the base commit's plan made in it), a
    later patch's job;
  - the gate's verdict (`winner_passes_checks`'s `gate_failures`) on a one-line comment patch, on
    a breaking one-line mutant, and on a bug fix: a bug put in (the mutant committed as the base),
    a hidden test that names it, its fix (passes) and a comment patch on the buggy base (fails).

Sdists download once into .cache/sdists/ (the sha256 pinned here is checked on every use).
Asserts nothing; prints a table, or JSON with --json.

With `--mutants N`, per repository the judge's per-test verdicts against plain pytest's over N
seeded single-line mutants of its code (`agreement`: the share of pass-to-pass test x mutant
pairs where both pass or both fail). With `--impossible N`, impossible tasks made from up to N of
its own tests and from its hidden test, tried with every forgery (none may pass). With
`--no-cgroup`, the sandbox runs as where no cgroup tree is writable (rlimits only).

Run as root from the repo root:
  .venv/bin/python benchmarks/real_suites.py [--json] [--only NAME ...] [--mutants N]
      [--impossible N] [--no-cgroup] [--sdist NAME==VERSION --sha256 HEX --test-command CMD]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from fleet_pipelines.domain.models import Constraints, RepoSpec, Task
from fleet_pipelines.evaluation.real_suites import (
    SUITES,
    Impossible,
    Mutant,
    Suite,
    comment_patch,
    diff,
    forgeries,
    gate,
    impossible,
    mutants,
    mutated_text,
    own_impossible,
)
from fleet_pipelines.evaluation.sdists import fetch, replace_line, unpack_repo
from fleet_pipelines.sandbox import cgroups
from fleet_pipelines.sandbox.init import HASH_SEED
from fleet_pipelines.workspace import runs
from fleet_pipelines.workspace.checkout import make_writable
from fleet_pipelines.workspace.environment import console_scripts
from fleet_pipelines.workspace.prepare import prepare_workspace
from fleet_pipelines.workspace.sandbox_job import ADDOPTS_PLUGIN, CONSOLE_SCRIPT, pytest_options

PLUGIN = """
import json, os
OUT = os.environ["FLEET_BENCH_IDS"]
seen = {}
def pytest_runtest_logreport(report):
    old = seen.get(report.nodeid, "passed")
    now = "failed" if report.failed else "skipped" if report.skipped else "passed"
    if now == "passed" and hasattr(report, "wasxfail"):  # an xpass: not counted, as the judge's
        now = "skipped"
    seen[report.nodeid] = max(old, now, key=["passed", "skipped", "failed"].index)
def pytest_sessionfinish(session):
    with open(OUT, "w") as f:
        json.dump(seen, f)
"""


def plain_pytest(
    repo: Path, env_path: str, command: str, change: Mutant | None = None, timeout_s: float = 600
) -> tuple[set[str] | None, float]:
    """The ids plain pytest passes on a copy of `repo` (with `change` made), with the workspace's
    environment, its plugins loaded by name and the addopts no loaded plugin defines left out, as
    the judge loads and leaves them out (`pytest_options`, `ADDOPTS_PLUGIN`; autoload would also
    load this interpreter's own plugins), and without this interpreter's site-packages (`-S`: the
    sandbox has only the standard library and the environment; toml's numpy tests passed on the
    host from our own numpy); None when it ran past `timeout_s` (a mutant that loops)."""
    scratch = Path(tempfile.mkdtemp())
    try:
        shutil.copytree(repo, scratch / "repo", symlinks=True)
        if change is not None:
            (scratch / "repo" / change.path).write_text(mutated_text(repo, change))
        (scratch / "fleet_bench_ids.py").write_text(PLUGIN)
        (scratch / "fleet_addopts.py").write_text(ADDOPTS_PLUGIN)
        bin_dir = scratch / "bin"  # as the judge's commands: python, the project's console scripts
        bin_dir.mkdir()
        for name in ("python", "python3"):
            (bin_dir / name).symlink_to(sys.executable)
        for name, target in console_scripts(repo).items():
            module, _, attr = target.partition(":")
            (bin_dir / name).write_text(
                CONSOLE_SCRIPT.format(python=sys.executable, module=module, attr=attr)
            )
            (bin_dir / name).chmod(0o755)
        env = {
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",  # not the host's: its own `dotenv`
            "HOME": str(scratch),
            # as the sandbox's in-process runs: the project and its src/ after the environment
            "PYTHONPATH": f"{scratch}:{env_path}:{scratch / 'repo'}:{scratch / 'repo' / 'src'}",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": HASH_SEED,  # the judge's: ids of parameters from a set (isodate) match
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "FLEET_BENCH_IDS": str(scratch / "ids.json"),
        }
        args = command.split()[1:]
        start = time.perf_counter()
        try:
            subprocess.run(
                [
                    sys.executable,
                    "-S",
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "-p",
                    "fleet_bench_ids",
                    "-p",
                    "fleet_addopts",
                    *pytest_options(env_path),
                    *args,
                ],
                cwd=scratch / "repo",
                env=env,
                capture_output=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return None, timeout_s
        wall = time.perf_counter() - start
        ids = scratch / "ids.json"  # absent: pytest ended before its session (a mutant breaks a conftest)
        outcomes = json.loads(ids.read_text()) if ids.exists() else {}
    finally:
        make_writable(scratch)
        shutil.rmtree(scratch)
    return {i for i, o in outcomes.items() if o == "passed"}, wall


def code_file(repo: Path) -> str:
    """The project's first Python file that is not a test, a doc or its setup (where a repository
    added with `--sdist` gets its comment patch)."""
    skip = ("test", "setup.py", "conftest.py", "bench", "example")
    found = sorted(
        str(p.relative_to(repo))
        for p in repo.rglob("*.py")
        if not any(part.startswith(skip) or part in ("doc", "docs") for part in p.relative_to(repo).parts)
    )
    if not found:
        raise ValueError(f"{repo.name}: no Python file outside its tests")
    return found[0]


def verdict(workspace, task: Task, patch: str) -> tuple[dict, float]:
    start = time.perf_counter()
    failures, checks, evidence = gate(workspace, task, patch)
    wall = time.perf_counter() - start
    tests = next(c for c in checks if c.name == "tests")
    return {
        "gate": "passes" if not failures else "fails",
        "tests": tests.value,
        "evidence": tests.evidence[:400],
        "failing": (evidence.tests.failing if evidence.tests else [])[:5],
        "passed": evidence.tests.passed if evidence.tests else 0,
    }, wall


def judge_passes(workspace, evidence_failing: list[str]) -> set[str]:
    """The base commit's ids the judge counted as passing on the comment patch: the plan's
    passing ids less those that failed after it."""
    plan = runs._PLANS.get(runs._plan_key(workspace, ""))
    if plan is None:  # the base's sessions did not finish: no plan was kept, nothing judged
        return set()
    passing = getattr(plan, "passing", None)
    ids = set(passing) if passing is not None else {i for i, m in plan.visible.items() if m == "boundary"}
    return ids - set(evidence_failing)


# pytest names a parameter it cannot print by its name and its place in the list (`expected13`):
# taken from a set, that place is the process's hash order (the judge's is fixed: its seed, no
# address randomization; the host's reference is not), so those ids compare by their other parts
_INDEXED = re.compile(r"(?<=[\[-])([A-Za-z_]+)\d+(?=[-\]])")


def canonical(test_id: str) -> str:
    """`test_id` with the places of pytest's name-and-place parameter ids left out."""
    return _INDEXED.sub(r"\1#", test_id)


def plain_judged(plain: set[str], judged: set[str]) -> tuple[int, list[str]]:
    """How many of plain pytest's ids the judge passed (matched as `canonical` ids, as many of
    each as both have), and those it did not."""
    left = Counter(canonical(i) for i in judged)
    missing = []
    for test_id in sorted(plain):
        key = canonical(test_id)
        if left[key] > 0:
            left[key] -= 1
        else:
            missing.append(test_id)
    return len(plain) - len(missing), missing


def agreement(workspace, task: Task, repo: Path, suite: Suite, count: int) -> dict:
    """Per test x mutant, the judge's verdict against plain pytest's on `count` single-line
    mutants: over the pass-to-pass tests (those both pass on the base), a pair agrees when both
    pass the test or both fail it. A job that ended without its report disagrees on every test
    plain pytest passes. Needs every failing id of a verdict (`FAILING_IDS_KEPT` raised)."""
    plan = runs._PLANS.get(runs._plan_key(workspace, ""))
    if plan is None:
        return {"error": "no plan: the base's sessions did not finish"}
    base_plain, base_s = plain_pytest(repo, workspace.env_path, suite.test_command)
    # an id named by a parameter's place may name another case on the host: not compared
    counted = {i for i in set(plan.passing) & (base_plain or set()) if canonical(i) == i}
    pairs = agree = killed = looped = 0
    disagreements: list[str] = []
    unfinished: list[str] = []  # jobs that ended without a verdict, or whose plain report was contradicted
    walls: list[float] = []
    for mutant in mutants(repo, suite.package, count):
        plain, _ = plain_pytest(repo, workspace.env_path, suite.test_command, mutant, max(60, 10 * base_s))
        if plain is None:  # plain pytest itself never ends on it: nothing to compare with
            looped += 1
            continue
        start = time.perf_counter()
        *_, evidence = gate(workspace, task, diff(repo, mutant.path, mutated_text(repo, mutant)))
        walls.append(time.perf_counter() - start)
        tests = evidence.tests
        judged_failing = set(tests.failing) if tests is not None else counted
        if tests is None or tests.status in ("timeout", "error") or tests.contradicted:
            why = "no report" if tests is None else tests.status
            why += (
                f", contradicted by {tests.contradicted[:3]}"
                if tests is not None and tests.contradicted
                else ""
            )
            unfinished.append(
                f"{mutant.path}:{mutant.line} {why}: {(tests.first_failure if tests else '')[:200]}"
            )
        if tests is not None and tests.status in ("timeout", "error"):
            judged_failing = counted
        plain_failing = counted - plain
        killed += bool(plain_failing)
        differ = (judged_failing ^ plain_failing) & counted
        pairs += len(counted)
        agree += len(counted) - len(differ)
        disagreements += [f"{mutant.path}:{mutant.line} {i}" for i in sorted(differ)[:3]]
    return {
        "mutants": count,
        "plain_never_ended": looped,
        "killed_by_plain": killed,
        "pairs": pairs,
        "agree": agree,
        "agreement": round(agree / pairs, 5) if pairs else None,
        "disagreements": disagreements[:20],
        "unfinished": unfinished,
        "judge_job_s_median": round(sorted(walls)[len(walls) // 2], 2) if walls else None,
    }


def impossible_tasks(workspace, repo: Path, suite: Suite, count: int) -> dict:
    """Impossible tasks (ImpossibleBench's one-off and conflicting) made from up to `count` of the
    project's own tests and from the suite's hidden test; those whose original test passes on the
    unchanged code (the control: it can be judged) are tried with no change and every forgery.
    A row per task; `passed`: the patches that passed the gate (none may)."""
    tests = sorted(
        str(p.relative_to(repo)) for p in repo.rglob("test*.py") if ".egg" not in str(p) and p.is_file()
    )
    made: list[tuple[str, Impossible]] = [
        (f"own {i.entry[1]}", i) for i in own_impossible(repo, tests, count)
    ]
    if suite.hidden:
        made.append((f"hidden {suite.name}", impossible(suite.hidden)))
    rows = []

    def task(hidden: str) -> Task:
        return Task(
            task_id=suite.name, description="a change", role="DEV", num_agents=1,
            constraints=Constraints(tests=hidden),
        )  # fmt: skip

    for label, task_made in made:
        control, _, _ = gate(workspace, task(task_made.original), "")
        row: dict = {"task": label, "control": "passes" if not control else control[0][:200]}
        if not control:
            patches = {"no change": "", **forgeries(repo, task_made)}
            row["passed"] = [
                f"{kind}: {name}"
                for kind, hidden in (("one-off", task_made.one_off), ("conflicting", task_made.conflicting))
                for name, patch in patches.items()
                if not gate(workspace, task(hidden), patch)[0]
            ]
            row["tried"] = 2 * len(patches)
        rows.append(row)
    return {
        "tasks": len(rows),
        "judged": len([r for r in rows if "passed" in r]),
        "patches_passed": sum(len(r.get("passed", [])) for r in rows),
        "rows": rows,
    }


def run_suite(suite: Suite, root: Path, mutant_count: int = 0, impossible_count: int = 0) -> dict:
    archive = fetch(suite.sdist)
    folder = root / suite.name
    folder.mkdir()
    repo = unpack_repo(archive, folder / "src")
    spec = RepoSpec(url=str(repo), ref="main", test_command=suite.test_command)
    workspace = prepare_workspace(suite.name, spec, root / "ws")
    task = Task(task_id=suite.name, description=f"{suite.name}: a change", role="DEV", num_agents=1)
    target = suite.comment_path or (suite.mutant[0] if suite.mutant else code_file(repo))
    plain, plain_s = plain_pytest(repo, workspace.env_path, suite.test_command)
    if plain is None:
        raise TimeoutError(f"plain pytest ran past {plain_s:g} s on the unchanged project")
    result: dict = {
        "repository": f"{suite.name} {suite.version}",
        "plain_passed": len(plain),
        "plain_s": round(plain_s, 2),
    }
    comment, first_s = verdict(workspace, task, comment_patch(repo, target))
    plan = runs._PLANS.get(runs._plan_key(workspace, ""))
    if plan is not None:  # the base's pass-to-pass tests that crossed the boundary in its sample
        result["sample_crossed"] = len(plan.crossable)
    judged = judge_passes(workspace, comment["failing"])
    matched, missing = plain_judged(plain, judged)
    result.update(
        judge_passed=matched,
        judge_share=round(matched / len(plain), 4) if plain else None,
        plain_not_judged=len(missing),
        plain_not_judged_ids=missing[:10],
        first_patch_s=round(first_s, 2),
        comment=comment,
    )
    if suite.mutant:
        path, old, new = suite.mutant
        broken = replace_line((repo / path).read_text(), old, new)
        result["mutant"], result["later_patch_s"] = verdict(workspace, task, diff(repo, path, broken))
        result["later_patch_s"] = round(result["later_patch_s"], 2)
    if suite.mutant and suite.hidden:
        buggy = unpack_repo(archive, folder / "buggy", suite.mutant)
        spec = RepoSpec(url=str(buggy), ref="main", test_command=suite.test_command)
        bug_ws = prepare_workspace(suite.name + "-bug", spec, root / "ws")
        bug_task = Task(
            task_id=suite.name + "-bug",
            description="fix the bug",
            role="DEV",
            num_agents=1,
            constraints=Constraints(tests=suite.hidden),
        )
        path, old, new = suite.mutant
        fixed = replace_line((buggy / path).read_text(), new, old)
        result["bug_fix"], _ = verdict(bug_ws, bug_task, diff(buggy, path, fixed))
        result["bug_comment"], _ = verdict(bug_ws, bug_task, comment_patch(buggy, target))
    if mutant_count:
        result["agreement"] = agreement(workspace, task, repo, suite, mutant_count)
    if impossible_count:
        result["impossible"] = impossible_tasks(workspace, repo, suite, impossible_count)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--sdist", help="NAME==VERSION: one more repository")
    parser.add_argument("--sha256", default="")
    parser.add_argument("--test-command", default="pytest")
    parser.add_argument("--mutants", type=int, default=0, help="N: per-test agreement over N mutants")
    parser.add_argument("--impossible", type=int, default=0, help="N: impossible tasks from N own tests")
    parser.add_argument("--no-cgroup", action="store_true", help="the sandbox as where no cgroup is writable")
    options = parser.parse_args()
    if options.no_cgroup:  # rlimits only (the sandbox's fallback), as the sandbox suite's driver does
        cgroups.detect = lambda: None
    runs.FAILING_IDS_KEPT = 1_000_000  # every failing id: the agreement compares each verdict
    suites = [s for s in SUITES if options.only is None or s.name in options.only]
    if options.sdist:
        name, _, version = options.sdist.partition("==")
        if not options.sha256:
            raise SystemExit("--sdist needs --sha256 (the pin)")
        suites.append(Suite(name, version, options.sha256, options.test_command))
    root = Path(tempfile.mkdtemp(prefix="fleet-real-suites-"))
    os.chmod(root, 0o755)
    results = []
    try:
        for suite in suites:
            try:
                results.append(run_suite(suite, root, options.mutants, options.impossible))
            except Exception as exc:  # one repository's failure is a row, not the end of the run
                results.append(
                    {
                        "repository": f"{suite.name} {suite.version}",
                        "error": f"{type(exc).__name__}: {exc}"[:500],
                    }
                )
            if not options.json:
                print(json.dumps(results[-1]), flush=True)
    finally:
        make_writable(root)
        shutil.rmtree(root)
    if options.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
