"""Sandbox start-up: the current sandbox against an earlier one, in the same run.

The earlier implementation is read from git at a commit and loaded as a package from a temp dir
beside the current one: in the layout before the sandbox had its own package
(fleet_pipelines/scoring/ sandbox.py, sandbox_init.py and cgroups.py; by default 5161a66, the
last commit of that layout), or in that of fleet_pipelines/sandbox/ (a later commit). The
current one is fleet_pipelines/sandbox/ of this checkout. Both run, alternately:
  - `pass` (`run_python`): the fixed cost of one sandbox run;
  - a solution with one example and one test (`run_tests`: solution and tests in separate
    processes, result on a private fd; the one-process harness of commits before it).
Prints median and p90 per run and the difference in ms (also the median of the differences of
back-to-back pairs, steadier on a loaded machine); also the one-off first-call cost (probe, and
for bwrap the library scan). Asserts nothing.

Run as root from the repo root: .venv/bin/python benchmarks/sandbox_startup.py [runs] [commit]
(e.g. `30 573a9a1`: the bwrap sandbox before issue 20's hardening)
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet_pipelines import sandbox

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
PREVIOUS = sys.argv[2] if len(sys.argv) > 2 else "5161a66"
SOLUTION = "def add(a, b):\n    return a + b\n"
TESTS = "def test_add():\n    assert add(2, 3) == 5\n"
OLD_HARNESS = (  # what the previous tests check ran: one process, results printed
    "import json\nfrom solution import *\nresults = [add(1, 2) == 3]\n"
    "exec(compile(" + repr(TESTS) + ", 'tests.py', 'exec'))\ntest_add()\nresults.append(True)\n"
    "print('@@fleet-test-results@@' + json.dumps(results))\n"
)


def _show(path: str) -> str | None:
    shown = subprocess.run(
        ["git", "show", f"{PREVIOUS}:{path}"],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
    )
    return shown.stdout if shown.returncode == 0 else None


def load_previous(where: Path):
    """The sandbox of commit PREVIOUS, as the package `previous_sandbox`: its `run_python`,
    `run_tests` (where it had one) and `isolation_available`."""
    package = where / "previous_sandbox"
    package.mkdir()
    if _show("fleet_pipelines/sandbox/setup.py") is not None:  # the sandbox's own package
        names = {name: f"fleet_pipelines/sandbox/{name}" for name in ("__init__.py", "setup.py", "run.py")}
        names |= {
            "init.py": "fleet_pipelines/sandbox/init.py",
            "cgroups.py": "fleet_pipelines/sandbox/cgroups.py",
        }
        module = "previous_sandbox"
    else:  # fleet_pipelines/scoring/sandbox.py and its neighbours
        names = {
            name: f"fleet_pipelines/scoring/{name}"
            for name in ("sandbox.py", "sandbox_init.py", "cgroups.py")
        }
        (package / "__init__.py").write_text("")
        module = "previous_sandbox.sandbox"
    for name, path in names.items():
        text = _show(path)
        if text is not None:  # cgroups.py came later than the first sandbox
            (package / name).write_text(text)
    sys.path.insert(0, str(where))
    return importlib.import_module(module)


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def summary(name: str, samples: list[float]) -> str:
    p90 = statistics.quantiles(samples, n=10)[-1]
    return f"{name:<34} median {statistics.median(samples) * 1000:6.1f} ms   p90 {p90 * 1000:6.1f} ms"


def main() -> None:
    with tempfile.TemporaryDirectory() as where:
        previous = load_previous(Path(where))
        first_old = timed(previous.isolation_available)
        first_new = timed(sandbox.isolation_available)
        print(
            f"first call (probe): {PREVIOUS} {first_old:.2f} s, current {first_new:.2f} s (once per process)"
        )
        print(f"isolation {PREVIOUS}: {previous.isolation_available()[1]}")
        print(f"isolation current: {sandbox.isolation_available()[1]}")
        cases = {
            "pass": (
                lambda: previous.run_python("pass"),
                lambda: sandbox.run_python("pass"),
            ),
            "1 example + 1 test": (
                (lambda: previous.run_tests(SOLUTION, [("add(1, 2)", "3")], TESTS))
                if hasattr(previous, "run_tests")  # the bwrap sandbox's harness
                else (lambda: previous.run_python(OLD_HARNESS, files={"solution.py": SOLUTION})),
                lambda: sandbox.run_tests(SOLUTION, [("add(1, 2)", "3")], TESTS),
            ),
        }
        for case, (old, new) in cases.items():
            new(), old()  # warm
            old_s, new_s = [], []
            for _ in range(RUNS):
                old_s.append(timed(old))
                new_s.append(timed(new))
            print(summary(f"{case}: {PREVIOUS}", old_s))
            print(summary(f"{case}: current", new_s))
            paired = statistics.median(n - o for n, o in zip(new_s, old_s, strict=True)) * 1000
            print(f"{case}: current - {PREVIOUS}, median of the paired (back-to-back) runs: {paired:+.1f} ms")
            delta = (statistics.median(new_s) - statistics.median(old_s)) * 1000
            print(
                f"{case}: current - {PREVIOUS} = {delta:+.1f} ms per run (median), ratio "
                f"{statistics.median(new_s) / statistics.median(old_s):.2f}"
            )


if __name__ == "__main__":
    main()
