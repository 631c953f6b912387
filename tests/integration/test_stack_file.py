"""How `fleet` commands find the running local stack, each command a process of its own with a
clean environment: the stack's NATS from its folder's `.fleet/stack.json`, and without a stack or
NATS_URL a one-line refusal that connects nowhere (the stack file itself:
tests/unit/test_stack_file.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleet_pipelines.events.options import NO_NATS
from fleet_pipelines.events.streams import NatsError
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.stack_file import write_stack
from tests.unit.test_stack_file import PARTS

CLEAN = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def fleet(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleet_pipelines.cli", *args],
        cwd=cwd,
        env={**CLEAN, "HOME": str(cwd), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_a_stack_or_nats_url_commands_say_so_in_one_line_and_connect_nowhere(tmp_path: Path):
    with pytest.raises(NatsError, match=NO_NATS.replace("(", r"\(").replace(")", r"\)")):
        NatsResource().ensure_streams(dry_run=True)
    for args in (
        ["nats", "init"],
        ["nats", "rejected"],
        ["deliberate", "Write add(a, b)."],
        ["run", "Write add."],
    ):
        done = fleet(tmp_path, *args)
        verb = " ".join(args[:2]) if args[0] == "nats" else args[0]
        assert (done.returncode, done.stderr) == (1, f"fleet {verb}: {NO_NATS}\n"), done.stderr


def test_a_command_in_the_stacks_folder_finds_its_nats_with_a_clean_environment(
    tmp_path: Path, nats_server: str
):
    write_stack(tmp_path / ".fleet", "http://127.0.0.1:3999", {**PARTS, "NATS_URL": nats_server})
    done = fleet(tmp_path, "nats", "init", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "PLANNING_EVENTS: " in done.stdout and done.stdout.endswith("dry run: nothing was changed\n")
