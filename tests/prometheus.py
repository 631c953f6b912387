"""Prometheus's tools for the tests (Debian's `prometheus` package, installed by `make prometheus`
where missing, as `make test` does) and the monitoring files under deploy/monitoring/."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from fleet_pipelines.cli import REPO_ROOT

MONITORING = REPO_ROOT / "deploy" / "monitoring"


def ensure_prometheus() -> Path:
    """promtool's path, after installing the package if this machine lacks it (CI: a fresh
    Debian machine, as root)."""
    if shutil.which("promtool") is None:
        subprocess.run(["make", "-s", "prometheus"], cwd=REPO_ROOT, check=True)
    return Path(shutil.which("promtool") or "promtool")


def dashboard_queries() -> list[str]:
    """Every query of the Grafana dashboard, with its variables filled in."""
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    return [
        target["expr"].replace("$__rate_interval", "1m")
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
