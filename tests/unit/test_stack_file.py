"""How every command finds the running local stack: `.fleet/stack.json` written by `fleet dev`, an
explicit variable always winning, and no guessed server when there is neither (the commands
themselves, each a process of its own: tests/integration/test_stack_file.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_pipelines import stack
from fleet_pipelines.settings import FleetSettings
from fleet_pipelines.stack_file import read_stack, remove_stack, running_stack, write_stack

PARTS = {
    "NATS_URL": "nats://127.0.0.1:4999",
    "FLEET_LLM_BASE_URL": "http://127.0.0.1:8999/v1",
    "RAY_ADDRESS": "127.0.0.1:6999",
    "RAY_AUTH_TOKEN_PATH": "/tmp/stack-state/ray/auth_token",
    "DAGSTER_HOME": "/tmp/stack-home",
}


def test_settings_take_the_running_stacks_parts_and_a_variable_always_wins(tmp_path: Path):
    state = tmp_path / ".fleet"
    write_stack(state, "http://127.0.0.1:3999", {**PARTS, "OTHER": "not recorded"})
    assert read_stack(state).env == PARTS
    settings = FleetSettings.from_env({"FLEET_STATE_DIR": str(state)})
    assert settings.nats_url == PARTS["NATS_URL"] and settings.ray_address == PARTS["RAY_ADDRESS"]
    assert settings.llm_base_url == PARTS["FLEET_LLM_BASE_URL"]
    assert settings.dagster_home_path() == Path(PARTS["DAGSTER_HOME"])
    mine = FleetSettings.from_env(
        {"FLEET_STATE_DIR": str(state), "NATS_URL": "nats://mine:4222", "VLLM_URL": "http://mine:8000/v1"}
    )
    assert mine.nats_url == "nats://mine:4222" and mine.llm_base_url == "http://mine:8000/v1"
    assert mine.ray_address == PARTS["RAY_ADDRESS"]
    assert mine.ray_auth_token_path == PARTS["RAY_AUTH_TOKEN_PATH"]
    # The head's token goes with the head's address only: never to a cluster the environment names.
    elsewhere = FleetSettings.from_env({"FLEET_STATE_DIR": str(state), "RAY_ADDRESS": "ray://other:10001"})
    assert elsewhere.ray_address == "ray://other:10001" and elsewhere.ray_auth_token_path is None
    remove_stack(state)
    assert (
        read_stack(state) is None and FleetSettings.from_env({"FLEET_STATE_DIR": str(state)}).nats_url is None
    )


def test_a_record_whose_stack_is_gone_or_whose_pid_was_reused_is_ignored(tmp_path: Path):
    state = tmp_path / ".fleet"
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    path = write_stack(state, "http://127.0.0.1:3999", PARTS)
    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, "pid": int(gone.stdout)}))
    assert read_stack(state) is not None and running_stack(state) is None
    path.write_text(json.dumps({**body, "started": "1"}))  # this pid, but another process's start
    assert running_stack(state) is None
    assert FleetSettings.from_env({"FLEET_STATE_DIR": str(state)}).nats_url is None
    path.write_text("{not json")
    assert read_stack(state) is None


def test_a_second_fleet_dev_on_the_same_state_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture):
    write_stack(tmp_path, "http://127.0.0.1:3999", PARTS)  # this process stands for the running stack
    ports = stack.DevPorts(
        ui=stack.free_port(), model=stack.free_port(), ray=stack.free_port(), nats=stack.free_port()
    )
    assert stack.run_dev(ports, tmp_path, tmp_path / "home", Path.cwd()) == 1
    err = capsys.readouterr().err
    assert f"a local stack is already running here (pid {os.getpid()}, UI http://127.0.0.1:3999" in err
