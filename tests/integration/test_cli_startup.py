"""Quick commands stay quick: `fleet --help` loads no verb, and no command loads nats-py's
websocket transport (aiohttp) for a server it does not reach over websockets. Each check runs in
a fresh interpreter and reads its sys.modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fleet_pipelines.cli import VERBS
from fleet_pipelines.stack import free_port

REPO = Path(__file__).resolve().parents[2]


def modules_after(code: str, cwd: Path, env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (its SystemExit ignored)."""
    script = f"import json, sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\n"
    script += "print(json.dumps(list(sys.modules)))\n"
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=environ, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def loaded(modules: set[str], *packages: str) -> set[str]:
    return {m for m in modules if m.split(".")[0] in packages}


def test_fleet_help_imports_no_verb_nats_aiohttp_dagster_or_ray(tmp_path: Path):
    modules = modules_after("from fleet_pipelines.cli import main; main(['--help'])", tmp_path)
    assert not loaded(modules, "nats", "aiohttp", "dagster", "ray", "pydantic")
    assert not {f"fleet_pipelines.cli.{verb}" for verb in VERBS} & modules


def test_fleet_result_of_an_unknown_task_without_a_stack_leaves_the_websocket_transport_out(tmp_path: Path):
    env = {
        "FLEET_STATE_DIR": str(tmp_path / ".fleet"),
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "NATS_URL": f"nats://127.0.0.1:{free_port()}",  # nothing listens: the stream is not asked
    }
    modules = modules_after(
        "from fleet_pipelines.cli import main; main(['result', 'no-such-task'])", tmp_path, env
    )
    assert "nats.aio.client" in modules  # it did look in the planning stream
    assert not loaded(modules, "aiohttp", "dagster", "ray")


def test_a_websocket_server_still_gets_its_transport(tmp_path: Path):
    """Left out at import, aiohttp is imported when a ws:// server is asked for."""
    port = free_port()
    code = (
        "import asyncio\n    from fleet_pipelines.events.bus import connect\n"
        "    from nats.aio import transport\n"
        "    from fleet_pipelines.events.options import ConnectOptions\n"
        "    from fleet_pipelines.events.streams import NatsError\n"
        "    assert transport.aiohttp is None\n"
        "    try:\n"
        f"        asyncio.run(connect(ConnectOptions(url='ws://127.0.0.1:{port}', connect_timeout_s=0.5)))\n"
        "    except NatsError as exc:\n"
        "        print(exc)\n"
        "    assert transport.aiohttp is not None"
    )
    modules = modules_after(code, tmp_path)
    assert "aiohttp.client" in modules
