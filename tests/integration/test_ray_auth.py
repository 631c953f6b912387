"""Ray's token: the local stack's head requires its own, whatever the user's home holds, and the
deployment's head (as KubeRay starts it) refuses a Ray Client without the Secret's, while the runs
that present it share one admission queue through it.

Ray (2.60) turns token authentication on for a head started where `~/.ray/auth_token` exists (a
first local `ray.init()` writes it), and a client given an address never turns it on: the README's
`fleet run` then failed with "Authentication token is missing or incorrect". Here the head starts
from a home holding such a token; a client without the stack's token is refused, and one that
presents it joins, also after importing Ray first (which reads its settings at import). A refused
token is said at once, not retried.

deploy/k8s/raycluster.yaml turns on KubeRay's token authentication: the operator starts the head
with RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the Secret fleet-ray-token (key auth_token), and
the Dagster code server and run pods mount that Secret as a file and present it through
RAY_AUTH_TOKEN_PATH (deploy/dagster, deploy/helm). That head is started exactly so (the token in a
variable, no file) with its Ray Client server (the `ray://` port the pods use), beside a second
node (a worker pod, started the same way), and clients join through Ray Client as the pods do: one
presenting the Secret's value from a file joins; one without a token, or with another token, is
refused (Ray Client says so as "ray client connection timeout": its server answers UNAUTHENTICATED
and the client retries until it gives up); two runs connecting with ray:// (as deploy/ configures
them) share one admission queue and their turns' tokens come back through the client. One test
does all of it on one head: each head, node and Ray Client join costs seconds of a 2-core machine,
and the Ray Client checks were the tier's longest tests when each started its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from fleet_pipelines import stack
from fleet_pipelines.cli import REPO_ROOT
from tests.integration.test_admission import streamed_turns

JOIN = """
import logging, sys
import ray  # imported before the token is presented: Ray read its settings already
from fleet_pipelines.resources.ray_cluster import connect_ray, present_ray_token

logging.getLogger("ray.util.client.worker").setLevel(logging.DEBUG)  # what its server answered
if sys.argv[2]:
    present_ray_token(sys.argv[2])
connect_ray(lambda: ray.init(address=sys.argv[1], log_to_driver=False), *map(int, sys.argv[3:]))
print("joined", ray.get(ray.remote(lambda: 42).remote()))
"""

# Ray's own waits for an answer, cut short for a join that is to be refused: Ray Client gives its
# server 1 s to answer, three times, and sleeps 1 s after each refusal (a refused token looks like
# no answer to it; by default it waits 5, 10 and 15 s); a join through the GCS tries once (by
# default 20 times, a second apart). What it was answered is in its log either way.
REFUSED_ENV = {
    "RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1",
    "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1",
    "RAY_gcs_server_port_wait_time_s": "1",
}


def join(
    home: Path, address: str, token: Path | None, *attempts: int, refused: bool = False
) -> subprocess.Popen:
    """Starts a fresh process that joins `address`, presenting `token` (None: none), after
    importing Ray (`joined` waits for it); one expected to be `refused` under `REFUSED_ENV`."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), **(REFUSED_ENV if refused else {})}
    return subprocess.Popen(
        [sys.executable, "-c", JOIN, address, str(token or ""), *map(str, attempts)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# What Ray Client's server answers when it fails to start a client's session (seen under load,
# whatever the token): the join is tried again, never counted as a refusal. The second: the
# session's server process died as it started, and Ray's proxier, reading its command line to wait
# for it, raised psutil.ZombieProcess from `start_specific_server` (seen once in `make test`).
SERVER_FLAKES = ("Starting Ray client server failed", "in start_specific_server")


def joined(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=240)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.heavy(14)
def test_the_stacks_head_requires_its_token_whatever_home_holds(tmp_path: Path):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))  # the user's own Ray token
    token = stack.ray_auth_token(tmp_path / "state")
    assert token.stat().st_mode & 0o777 == 0o600
    assert stack.ray_auth_token(tmp_path / "state").read_text() == token.read_text()  # made once
    port = stack.free_port()
    head = stack.start_ray_head(tmp_path / "logs", port, token, num_cpus=1, env={"HOME": str(home)})
    try:
        address = f"127.0.0.1:{port}"
        # The stack's token, not the home's: the head took the one it was given.
        joining = [join(home, address, token), join(home, address, None, refused=True)]
        good, anyone = map(joined, joining)
        assert good.returncode == 0 and "joined 42" in good.stdout, good.stderr[-3000:]
        # Ray's one try (REFUSED_ENV) is refused, and connect_ray does not try again.
        assert anyone.returncode != 0, anyone.stdout
        assert "the Ray cluster refused this process's token (presented: none)" in anyone.stderr
        assert "InvalidAuthToken" in anyone.stderr and "Retrying" not in anyone.stderr
    finally:
        head.stop()


RUN_SCRIPT = """
import json, sys
import dagster as dg, ray
from fleet_pipelines.assets.deliberation import materialize_deliberation
from fleet_pipelines.dispatch.ray_dispatch import DispatchSettings, engine_queue, queue_name, code_version
from fleet_pipelines.resources.ray_cluster import connect_ray
from fleet_pipelines import wiring
from fleet_pipelines.settings import FleetSettings

sys.stdin.readline()  # imported while the cluster starts: the test says when it runs
task_id = sys.argv[1]
resources = wiring.resources(FleetSettings.from_env())
config = {"description": "Write add(a, b) in Python.", "role": "DEV", "num_agents": 3, "rounds": 0}
with dg.instance_for_test() as instance:
    result = materialize_deliberation(instance, resources, task_id, config)
    proposals = result.output_for_node("proposals")
engine = resources["turn_runner"].engine.to_model()
connect_ray(ray.init)  # RAY_ADDRESS=ray://...: the run's Ray resource disconnected at its end
print(json.dumps({
    "client": ray.util.client.ray.is_connected(),
    "statuses": [p.status.value for p in proposals],
    "contents": {p.agent_id: p.content for p in proposals},
    "queue": queue_name(engine, None, code_version()),
    "stats": ray.get(engine_queue(engine, DispatchSettings()).stats.remote()),
}))
"""


CODE_SERVER_TOKEN = "/var/run/secrets/fleet/ray/auth_token"  # where the pods mount the Secret's key


def readme_ray_checks() -> list[list[str]]:
    """The `kubectl exec deploy/fleet-pipelines -- ...` lines of deploy/README.md that run Ray, as
    the container runs them: the words after `--`."""
    text = (REPO_ROOT / "deploy" / "README.md").read_text()
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        if "kubectl -n fleet exec deploy/fleet-pipelines --" in line and "import ray" in line:
            found.append(shlex.split(line.split(" -- ", 1)[1]))
    return found


def code_server_env(address: str, token_file: Path) -> dict[str, str]:
    """The code server container's environment as deploy/dagster/components.yaml sets it (its
    ConfigMaps' values and its plain `env` values; the Secrets' variables play no part in Ray),
    with RAY_ADDRESS pointing at this test's head and the token file where this test put it."""
    docs = [
        d
        for name in ("dagster/components.yaml", "k8s/config.yaml")
        for d in yaml.safe_load_all((REPO_ROOT / "deploy" / name).read_text())
        if d
    ]
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "fleet-pipelines"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(maps[source["configMapRef"]["name"]])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    assert env["RAY_AUTH_TOKEN_PATH"] == CODE_SERVER_TOKEN and env["RAY_ADDRESS"].startswith("ray://")
    return {**env, "RAY_ADDRESS": address, "RAY_AUTH_TOKEN_PATH": str(token_file)}


def as_kuberay(name: str, args: list[str], log_dir: Path, value: str, home: Path) -> stack.Service:
    """Launches `ray start` with the token as KubeRay's SetContainerTokenAuthEnvVars sets it in
    every Ray container (a variable: no token file in a Ray pod), running this checkout as a pod
    runs the image (`started` says when its node runs)."""
    ray = str(Path(sys.executable).with_name("ray"))
    service = stack.launch(
        name,
        [ray, "start", *args, "--num-cpus=1", "--disable-usage-stats", "--block"],
        log_dir,
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": value, "HOME": str(home), "PYTHONPATH": str(REPO_ROOT)},
    )
    service.grace_s = stack.RAY_GRACE_S  # as the stack's own Ray nodes (its note says why)
    return service


def started(service: stack.Service) -> bool:
    return b"Ray runtime started" in service.log_path.read_bytes()


def restarted_until_started(
    node: stack.Service, restart: Callable[[int], stack.Service], restarts: int = 2
) -> stack.Service:
    """Waits for the worker `node`, restarting a `ray start` that exited as the kubelet restarts a
    worker pod whose container exited (`restart(n)` starts the n-th): Ray gives a joining node
    30 s to register with the GCS (fixed in ray/_private/node.py, 2.60), and a head busy starting
    clients on a loaded 2-core machine missed that once in CI ("The current node timed out during
    startup"). Returns the node that started; one that exited is stopped (its process group)."""
    n = 0
    while True:
        try:
            node.wait_ready(lambda current=node: started(current), 180)
            return node
        except RuntimeError:
            node.stop()
            n += 1
            if n > restarts:
                raise
            node = restart(n)


@pytest.mark.heavy(65)
@pytest.mark.ray_client
def test_ray_client_needs_the_secrets_token_from_a_file_and_its_runs_share_one_queue(
    llm_server: str, nats_resource, tmp_path: Path
):
    """The production path, on one head as KubeRay starts it beside a second node: a Ray Client
    join needs the Secret's token, presented from a file (without one or with another it is
    refused), and two runs at once connect with ray:// (as deploy/ configures them), share one
    admission queue and stream their tokens back."""
    value = secrets.token_hex(32)  # what `kubectl create secret ... auth_token=` holds
    home = tmp_path / "home"
    home.mkdir()
    mounted = tmp_path / "secrets" / "auth_token"  # the Secret's key, as the pods mount it
    mounted.parent.mkdir()
    mounted.write_text(value)
    other = tmp_path / "other"
    other.write_text(secrets.token_hex(32))
    port, client_port = stack.free_port(), stack.free_port()
    address = f"ray://127.0.0.1:{client_port}"
    joins: list[subprocess.Popen] = []
    runs: list[subprocess.Popen] = []
    head_args = [
        "--head",
        f"--port={port}",
        "--include-dashboard=false",
        f"--ray-client-server-port={client_port}",
    ]
    # Two runs through ray://, presenting the Secret's file as the run pods do, import while the
    # cluster starts; they go at once when it runs.
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "RAY_ADDRESS": address,
        "RAY_AUTH_TOKEN_PATH": str(mounted),
        "FLEET_LLM_BASE_URL": llm_server,
        "FLEET_MAX_TOKENS": "48",
        "FLEET_STORAGE_PATH": str(tmp_path / "storage"),
    }
    logs = [(tmp_path / f"client-run-{i}.out", tmp_path / f"client-run-{i}.err") for i in range(2)]
    head = as_kuberay("ray-head", head_args, tmp_path / "head", value, home)
    try:
        for i, (out, err) in enumerate(logs):
            with out.open("w") as stdout, err.open("w") as stderr:
                runs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", RUN_SCRIPT, f"client-run-{i}"],
                        env=env,
                        cwd=REPO_ROOT,
                        stdin=subprocess.PIPE,
                        stdout=stdout,
                        stderr=stderr,
                        text=True,
                    )
                )
        # 1. The second node starts once the head's GCS answers, as KubeRay's worker pods do (they
        #    wait for it), while the head starts the rest of its processes.
        head.wait_ready(lambda: stack.port_open("127.0.0.1", port), 180)
        node_args = [f"--address=127.0.0.1:{port}"]
        node = as_kuberay("ray-node", node_args, tmp_path / "node", value, home)
        try:
            # 2. Three clients join through the head's client server while the node starts (that
            #    server may fail to start a client's session once under load: the good join has
            #    3 attempts).
            head.wait_ready(lambda: stack.port_open("127.0.0.1", client_port) and started(head), 180)
            joins += [
                join(home, address, mounted, 3),
                join(home, address, None, 1, refused=True),
                join(home, address, other, 1, refused=True),
            ]
            # deploy/README.md's check, each line as written, in the code server's environment.
            pod_env = {
                **code_server_env(address, mounted),
                "HOME": str(home),
                "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                "PYTHONPATH": str(REPO_ROOT),
            }
            checks = readme_ray_checks()
            assert len(checks) == 2, checks
            readme = [
                subprocess.Popen(argv, env=pod_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for argv in checks
            ]
            joins += readme
            node = restarted_until_started(
                node,
                lambda n: as_kuberay("ray-node", node_args, tmp_path / f"node-restart-{n}", value, home),
            )
            # 3. Both runs go (one that failed already says why in its log).
            for run in runs:
                with contextlib.suppress(BrokenPipeError):
                    assert run.stdin is not None
                    run.stdin.write("go\n")
                    run.stdin.close()
            good, anyone, wrong, readme_admitted, readme_refused = map(joined, joins)
            for _ in range(2):  # the client server's known start failure under load, as the good join's
                if not any(flake in readme_admitted.stderr for flake in SERVER_FLAKES):
                    break
                retry = subprocess.Popen(
                    checks[0], env=pod_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
                readme_admitted = joined(retry)
            # The README's first line prints 42, its second (no mode, no token file) is refused.
            assert readme_admitted.returncode == 0, readme_admitted.stderr[-3000:]
            assert readme_admitted.stdout.strip().splitlines()[-1] == "42", readme_admitted.stdout
            assert readme_refused.returncode != 0, readme_refused.stdout
            assert "ray client connection timeout" in readme_refused.stderr, readme_refused.stderr[-3000:]
            assert good.returncode == 0 and "joined 42" in good.stdout, good.stderr[-3000:]
            # Ray Client's server aborts the calls UNAUTHENTICATED (ray/_private/authentication/
            # grpc_authentication_server_interceptor.py); the client retries until its connection
            # timeout, its log saying what the server answered (a server that was not there
            # would not have). The same address admits the client with the Secret's value, so
            # the token is what differs.
            for refused in (anyone, wrong):
                assert refused.returncode != 0, refused.stdout
                assert "ray client connection timeout" in refused.stderr, refused.stderr[-3000:]
                answer = "Received when checking init: Invalid or missing authentication token"
                assert answer in refused.stderr, refused.stderr[-3000:]
            for run in runs:
                run.wait(timeout=480)
        finally:
            node.stop()
    finally:
        for process in [*joins, *runs]:
            if process.poll() is None:
                process.kill()
                process.wait()
        head.stop()
    outputs = [(out.read_text(), err.read_text()) for out, err in logs]
    assert all(run.returncode == 0 for run in runs), [err[-3000:] for _, err in outputs]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert all(r["client"] for r in reports)
    assert all(r["statuses"] == ["completed"] * 3 for r in reports)
    assert reports[0]["queue"] == reports[1]["queue"]  # one queue for the engine, both runs in it
    last = max(reports, key=lambda r: r["stats"]["sent"])["stats"]
    assert last["sent"] >= 12 and last["peak_running"] <= 3  # 2 x (3 proposals + 3 judge turns)
    for i, report in enumerate(reports):  # tokens came back through the client and were published
        turns = streamed_turns(nats_resource, f"client-run-{i}")
        for agent_id, content in report["contents"].items():
            assert "".join(c["text"] for c in turns[(agent_id, "propose", None)]) == content
