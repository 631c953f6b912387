"""Dagster's own `dg` CLI knows the project (pyproject.toml's [tool.dg]): the same Definitions as
workspace.yaml and `dagster dev`. Run exactly as the README shows, from the project root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fleet_pipelines.cli import REPO_ROOT

DG = str(Path(sys.executable).with_name("dg"))


def dg(*args: str) -> subprocess.CompletedProcess:
    """`dg` as a user's shell runs it: without the DAGSTER_HOME a `fleet` command of an earlier test
    exported into this worker (two workers' `dg` migrating one SQLite home at once raced in alembic)."""
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    return subprocess.run([DG, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_dg_check_defs_loads_the_code_location():
    checked = dg("check", "defs")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "All definitions loaded successfully." in checked.stdout
    assert "virtual environment does not match" not in checked.stdout + checked.stderr


def test_dg_list_defs_names_the_deliberation_assets_jobs_and_sensors():
    listed = dg("list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr
    defs = json.loads(listed.stdout)
    assets = {a["asset_key"] for a in defs["assets"]}
    assert {"deliberation_task", "story_context", "proposals", "reviews", "scores", "decision"} <= assets
    assert {"deliberation_job", "evaluation_job"} <= {j["name"] for j in defs["jobs"]}
    assert "planning_sensor" in {s["name"] for s in defs["sensors"]}
