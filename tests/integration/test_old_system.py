"""The old system's variables as a process reads them at start-up: DELIBERATION_TIMEOUT sets the
code location's default deadline, and a variable nothing reads refuses the CLI and the code
location. Each check starts a fresh interpreter (the unit tier's part: tests/unit/test_old_system.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleet_pipelines.settings import FleetSettings


def launchpad_default_timeout(env: dict[str, str]) -> str:
    code = (
        "from fleet_pipelines.assets.deliberation import DeliberationConfig as C;"
        "print(C.model_fields['timeout_seconds'].default)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def test_deliberation_timeout_sets_the_default_deadline(monkeypatch: pytest.MonkeyPatch):
    assert FleetSettings.from_env({"DELIBERATION_TIMEOUT": "42"}).deliberation_timeout_s == 42
    assert FleetSettings.from_env({}).deliberation_timeout_s == 300
    assert (
        FleetSettings.from_env(
            {"DELIBERATION_TIMEOUT": "42", "FLEET_DELIBERATION_TIMEOUT": "7"}
        ).deliberation_timeout_s
        == 7
    )
    base = {"PATH": "/usr/bin:/bin", "NATS_URL": "nats://127.0.0.1:1"}
    assert launchpad_default_timeout({**base, "DELIBERATION_TIMEOUT": "42"}) == "42.0"
    assert launchpad_default_timeout(base) == "300.0"


@pytest.mark.parametrize(
    ("name", "replacement"),
    [("ENABLE_NATS", "set NATS_URL"), ("AGENT_TYPE", "a council's role comes from each task")],
)
def test_old_variables_nothing_reads_are_refused_at_start_up(name: str, replacement: str, tmp_path: Path):
    with pytest.raises(ValueError, match=f"{name}: .*{replacement}"):
        FleetSettings.from_env({name: "true"})
    env = {"PATH": "/usr/bin:/bin", name: "true"}
    cli = subprocess.run(
        [sys.executable, "-m", "fleet_pipelines.cli", "councils", "list"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2 and cli.stdout == ""
    assert cli.stderr.startswith(f"fleet: refused environment: {name}: ") and cli.stderr.count("\n") == 1
    location = subprocess.run(
        [sys.executable, "-c", "import fleet_pipelines.definitions"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert location.returncode != 0 and f"ValueError: {name}: " in location.stderr
