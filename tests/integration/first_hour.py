"""A new user's first hour, inside a private network namespace (run by test_first_hour.py).

Inside `unshare --net` (as root; `--user --map-root-user --net` otherwise), 127.0.0.1 is this run's
alone: `make dev` listens on its default ports (3000, 8080, 6380, 4223) as on a fresh machine, and
port 4222, where a machine often runs its own NATS, is held by a decoy nats-server that the user
never chose (and which must see no connection at all). In a project folder laid out like a checkout
(Makefile, pyproject.toml, .venv, the model folder), `make dev` runs in one process and the README's
blocks run in another, each with a clean environment (`env -i`), as a second shell would. HOME
holds a Ray token of the user's own, as a first `ray.init()` leaves it. On the same stack, a run
is launched as the UI's launchpad does (GraphQL); then Ctrl-C, after which no process of the stack
may be left, no port open, and a command in the folder says how to start one. Prints a JSON
report on stdout.

    python -m tests.integration.first_hour PROJECT_DIR BLOCKS_JSON
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import urlparse

from fleet_pipelines.cli import REPO_ROOT
from fleet_pipelines.llm.local_server import default_model_dir
from fleet_pipelines.stack import port_open
from fleet_pipelines.stack_file import read_stack

from .processes import MARK, left_after

CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
DECOY_PORT, DECOY_MONITOR = 4222, 8222
DEV_PORTS = (3000, 8080, 6380, 4223)  # make dev's defaults: UI, model, Ray, NATS
LAUNCHPAD_MAX_TOKENS = 24


def loopback_up() -> None:
    """`ip link set lo up` without iproute2: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, request)[:18])[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1))


def lay_out(project: Path) -> None:
    """A checkout as `make dev` and `dg` need it: the Makefile, pyproject.toml (its install stamp
    and `dg`'s project), the package, the Dagster files, the virtualenv and the fetched model,
    linked from this checkout."""
    project.mkdir(parents=True, exist_ok=True)
    # deploy/: `make install` resolves under deploy/constraints.txt.
    for name in (
        "Makefile",
        "pyproject.toml",
        "deploy",
        "fleet_pipelines",
        "workspace.yaml",
        "dagster.yaml",
        ".venv",
    ):
        (project / name).symlink_to(REPO_ROOT / name)
    (project / ".fleet").mkdir()
    (project / ".fleet" / "models").symlink_to(default_model_dir())


def start_make_dev(project: Path, home: Path, mark: str) -> subprocess.Popen:
    process = subprocess.Popen(
        ["make", "dev"],
        cwd=project,
        env={**CLEAN_ENV, "HOME": str(home), MARK: mark},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 400
    output: list[str] = []
    while not (output and "dagster UI:" in output[-1]):
        if time.monotonic() > deadline or process.poll() is not None:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
            raise RuntimeError("make dev did not start:\n" + "".join(output))
        output.append(process.stdout.readline())
    return process


def run_block(project: Path, home: Path, block: str) -> dict:
    """One README block as a second shell runs it: `env -i` plus PATH and HOME, `set -e`."""
    started = time.monotonic()
    clean = [f"{k}={v}" for k, v in {**CLEAN_ENV, "HOME": str(home)}.items()]
    done = subprocess.run(
        ["env", "-i", *clean, "bash", "-e", "-c", block],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return {
        "block": block,
        "rc": done.returncode,
        "stdout": done.stdout,
        "stderr": done.stderr,
        "seconds": round(time.monotonic() - started, 1),
    }


def launchpad_run(project: Path) -> dict:
    """A run launched as a person does in the UI: the partition added, deliberation_job launched
    from the launchpad (GraphQL) with the council resource's token cap set in its run config (as
    the launchpad's config editor allows: the README's blocks already ran the default budgets),
    followed to its end."""
    import dagster as dg
    from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

    from fleet_pipelines.assets.deliberation import deliberation_partitions, deliberation_run_config

    record = read_stack(project / ".fleet")
    with dg.DagsterInstance.from_config(record.env["DAGSTER_HOME"]) as instance:
        instance.add_dynamic_partitions(deliberation_partitions.name, ["dev-smoke-1"])
        client = DagsterGraphQLClient("127.0.0.1", port_number=DEV_PORTS[0])
        config = {"description": "Write add(a, b) in Python.", "role": "DEV", "num_agents": 2, "rounds": 0}
        run_config = {
            **deliberation_run_config(config),
            "resources": {"council": {"config": {"max_tokens": LAUNCHPAD_MAX_TOKENS}}},
        }
        run_id = client.submit_job_execution(
            "deliberation_job",
            run_config=run_config,
            tags={"dagster/partition": "dev-smoke-1"},
        )
        status = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and status not in (
            dg.DagsterRunStatus.SUCCESS,
            dg.DagsterRunStatus.FAILURE,
            dg.DagsterRunStatus.CANCELED,
        ):
            time.sleep(2)
            try:
                status = client.get_run_status(run_id)
            except DagsterGraphQLClientError:
                status = None
        proposals = [  # the proposals asset's materialization metadata (its UI preview)
            event.dagster_event.step_materialization_data.materialization.metadata
            for event in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
            if event.dagster_event.step_materialization_data.materialization.asset_key
            == dg.AssetKey("proposals")
        ]
        return {
            "status": status.value if status else None,
            "engine_tag": instance.get_run_by_id(run_id).tags.get("fleet/engine"),
            "engine": urlparse(record.env["FLEET_LLM_BASE_URL"]).netloc,
            "proposals_preview": proposals[0]["preview"].value if proposals else "",
            # each proposal's completion tokens: the cap in the run config held
            "proposal_tokens": [int(row.data["tokens_out"]) for row in proposals[0]["turns"].value.records]
            if proposals
            else [],
        }


def start_decoy(root: Path) -> subprocess.Popen:
    """Another NATS (JetStream, monitoring on) on 4222: the server nobody chose."""
    server = str(Path(sys.executable).with_name("nats-server"))
    argv = [server, "--addr", "127.0.0.1", "--port", str(DECOY_PORT), "--jetstream"]
    argv += ["--store_dir", str(root / "decoy"), "--http_port", str(DECOY_MONITOR)]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not port_open("127.0.0.1", DECOY_MONITOR):
        if time.monotonic() > deadline:
            raise RuntimeError("decoy nats-server did not start")
        time.sleep(0.1)
    return process


def decoy_state() -> dict:
    def get(path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{DECOY_MONITOR}{path}", timeout=5) as response:
            return json.load(response)

    varz, jsz = get("/varz"), get("/jsz")
    return {
        "total_connections": varz["total_connections"],
        "in_msgs": varz["in_msgs"],
        "streams": jsz.get("streams", 0),
        "messages": jsz.get("messages", 0),
    }


def main(project: Path, blocks: list[str]) -> dict:
    loopback_up()
    home = Path(tempfile.mkdtemp(prefix="first-hour-home-"))
    # A user who ever ran Ray: a first local `ray.init()` leaves a token here, and Ray then turns
    # token authentication on for any head started from this home (our stack's included).
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    lay_out(project)
    report: dict = {"passes": {}}
    # One pass, with the decoy up from the start: a block that passes while the decoy sees no
    # connection at all would pass the same with nothing on 4222 (it never goes there).
    report["4222_free"] = not port_open("127.0.0.1", DECOY_PORT)
    decoy = start_decoy(project)
    mark = uuid.uuid4().hex
    try:
        stack = start_make_dev(project, home, mark)
        try:
            report["passes"]["another NATS on 4222"] = [run_block(project, home, b) for b in blocks]
            report["decoy"] = decoy_state()
            report["launchpad_run"] = launchpad_run(project)
        finally:
            os.killpg(stack.pid, signal.SIGINT)
            report["make_dev_rc"] = stack.wait(120)
            report["stack_record_left"] = (project / ".fleet" / "stack.json").exists()
            report["processes_left"] = left_after(mark)
            report["ports_open"] = [port for port in DEV_PORTS if port_open("127.0.0.1", port)]
        report["after_stop"] = run_block(
            project, home, '.venv/bin/fleet deliberate "Write mul(a, b) in Python."'
        )
    finally:
        decoy.terminate()
        decoy.wait(20)
    return report


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), json.loads(sys.argv[2]))))
