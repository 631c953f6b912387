"""A real Prometheus (Debian's `prometheus` package) scraping the local stack: its configuration,
built from where the stack serves metrics, and its command line.

The scrape of Ray's metrics agent keeps the fleet's own series (`ray_fleet_*`, the admission
queues') and drops the labels Ray adds per process and per cluster start (`WorkerId`,
`SessionName`, …): a queue actor restarted by Ray, or a head started again, continues the same
series. The cluster's PodMonitor does the same (deploy/monitoring/).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlsplit

import yaml

RULES_FILE = Path(__file__).resolve().parent.parent.parent / "deploy" / "monitoring" / "rules.yml"
# Labels Ray puts on every series of an actor: its process, node, cluster start and exporter.
RAY_PROCESS_LABELS = "WorkerId|SessionName|NodeAddress|Component|Version|otel_scope_.*"
RAY_RELABEL = [
    {"source_labels": ["__name__"], "regex": "ray_fleet_.*", "action": "keep"},
    {"regex": RAY_PROCESS_LABELS, "action": "labeldrop"},
]
INSTALL_HINT = (
    "Prometheus is not installed: `apt-get install -y prometheus` (Debian's package; it brings promtool)"
)


def scrape_config(targets: dict[str, str], interval_s: float, rules: Path | None = RULES_FILE) -> dict:
    """Prometheus's configuration: one job per target (name -> http://host:port/path)."""
    jobs = []
    for name, url in targets.items():
        where = urlsplit(url)
        job = {
            "job_name": name,
            "metrics_path": where.path or "/metrics",
            "static_configs": [{"targets": [where.netloc]}],
        }
        if name == "ray":
            job["metric_relabel_configs"] = RAY_RELABEL
        jobs.append(job)
    interval = f"{max(int(interval_s * 1000), 100)}ms"
    config: dict = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": jobs,
    }
    if rules is not None and rules.exists():
        config["rule_files"] = [str(rules)]
    return config


def prometheus_argv(
    folder: Path, port: int, targets: dict[str, str], interval_s: float = 5.0, rules: Path | None = RULES_FILE
) -> list[str]:
    """Writes `folder`/prometheus.yml and returns the command that serves on 127.0.0.1:`port` with
    its data in `folder`/data. Raises FileNotFoundError when Prometheus is not installed."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError(INSTALL_HINT)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(targets, interval_s, rules), sort_keys=False))
    return [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
