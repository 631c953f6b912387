"""Start-up: importing the code location, `fleet result` and `fleet --help`, each in a fresh process,
beside a bare `import dagster` measured in the same run (the floor every Dagster process pays).

    .venv/bin/python benchmarks/startup.py [--repeats 7]

`fleet result` runs against an empty Dagster home and an unreachable NATS, so it measures the
command's own start-up and lookups, not a server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = {
    "python -c 'import dagster'": [sys.executable, "-c", "import dagster"],
    "import fleet_pipelines.definitions": [sys.executable, "-c", "import fleet_pipelines.definitions"],
    "fleet result TASK_ID": [sys.executable, "-m", "fleet_pipelines.cli", "result", "no-such-task"],
    "fleet --help": [sys.executable, "-m", "fleet_pipelines.cli", "--help"],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    env = {
        **os.environ,
        "DAGSTER_HOME": tempfile.mkdtemp(prefix="fleet-startup-"),
        "NATS_URL": "nats://127.0.0.1:1",
    }
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):  # interleaved, so load on the machine hits every case alike
        for name, argv in CASES.items():
            start = time.perf_counter()
            subprocess.run(argv, env=env, capture_output=True, check=False)
            times[name].append(time.perf_counter() - start)
    floor = statistics.median(times["python -c 'import dagster'"])
    print(f"\nmedians of {args.repeats} fresh processes:")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:38s} {median:5.2f} s  ({median / floor:.2f}x import dagster)")


if __name__ == "__main__":
    main()
