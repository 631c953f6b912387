"""Builds prometheusrule.yaml (the Prometheus Operator's PrometheusRule) from rules.yml, the
plain rules file promtool tests: `python build.py` writes it, `python build.py --check` fails
when the committed one is not what rules.yml gives."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
HEADER = "# Built from rules.yml by build.py: edit rules.yml, then run `python deploy/monitoring/build.py`.\n"


def build() -> str:
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "fleet-pipelines", "namespace": "fleet", "labels": {"release": "prometheus"}},
        "spec": yaml.safe_load((HERE / "rules.yml").read_text()),
    }
    return HEADER + yaml.safe_dump(rule, sort_keys=False, width=100)


if __name__ == "__main__":
    target = HERE / "prometheusrule.yaml"
    if "--check" in sys.argv[1:]:
        if not target.exists() or target.read_text() != build():
            sys.exit(f"{target.name} is not built from rules.yml: run `python deploy/monitoring/build.py`")
    else:
        target.write_text(build())
