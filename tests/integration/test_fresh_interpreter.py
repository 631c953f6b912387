"""What loading the code location and connecting to Ray leave in a fresh interpreter: no thread
started and no sandbox probed at import (the sandbox warns at its first use), and no Ray Data
imported by connecting."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_code_location_starts_no_thread_and_probes_nothing():
    """The sandbox's warning comes at its first use (and from `fleet dev`), never from a thread
    started when Dagster loads the code location."""
    program = (
        "import threading\n"
        "import fleet_pipelines.definitions\n"
        "from fleet_pipelines.sandbox import run\n"
        "print([t.name for t in threading.enumerate()], run._setup.cache_info().currsize)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["['MainThread']", "0"], done.stdout


def test_connecting_applies_no_ray_data_settings():
    """dagster-ray's connect applies Ray Data settings in the run and on a worker (~2.5 s of every
    run's start, importing ray.data); the resource keeps the rest of connect but not those."""
    code = (
        "import sys; from fleet_pipelines.resources.ray_cluster import RayCluster; "
        "o = RayCluster().data_execution_options; o.apply(); o.apply_remote(); "
        "print('ray.data' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]
