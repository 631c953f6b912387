"""Ray's token: the local stack's head requires its own, whatever the user's home holds, and the
deployment's head (as KubeRay starts it) refuses a Ray Client without the Secret's.

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
variable, no file) with its Ray Client server (the `ray://` port the pods use), and clients join
through Ray Client as the pods do: one presenting the Secret's value from a file joins; one
without a token, or with another token, is refused (Ray Client says so as "ray client connection
timeout": its server answers UNAUTHENTICATED and the client retries until it gives up).
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_pipelines import stack

pytestmark = pytest.mark.integration

JOIN = """
import sys
import ray  # imported before the token is presented: Ray read its settings already
from fleet_pipelines.resources.ray_cluster import connect_ray, present_ray_token

if sys.argv[2]:
    present_ray_token(sys.argv[2])
connect_ray(lambda: ray.init(address=sys.argv[1], log_to_driver=False), *map(int, sys.argv[3:]))
print("joined", ray.get(ray.remote(lambda: 42).remote()))
"""


def join(
    home: Path, address: str, token: Path | None, *attempts: int, refused: bool = False
) -> subprocess.CompletedProcess:
    """A fresh process that joins `address`, presenting `token` (None: none), after importing Ray.
    One expected to be `refused` through Ray Client waits 1, 2 and 4 s for its server's answer
    (Ray's default: 5, 10 and 20 s; a refused token looks like no answer to it)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    if refused:
        env["RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S"] = "1"
    return subprocess.run(
        [sys.executable, "-c", JOIN, address, str(token or ""), *map(str, attempts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.heavy(37)
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
        joined = join(home, address, token)
        assert joined.returncode == 0 and "joined 42" in joined.stdout, joined.stderr[-3000:]
        anyone = join(home, address, None)  # Ray itself retries for ~30 s; we do not retry
        assert anyone.returncode != 0, anyone.stdout
        assert "the Ray cluster refused this process's token (presented: none)" in anyone.stderr
        assert "InvalidAuthToken" in anyone.stderr and "Retrying" not in anyone.stderr
    finally:
        head.stop()


@pytest.mark.heavy(60)
def test_ray_client_needs_the_secrets_token_presented_from_a_file(tmp_path: Path):
    value = secrets.token_hex(32)  # what `kubectl create secret ... auth_token=` holds
    home = tmp_path / "home"
    home.mkdir()
    port, client_port = stack.free_port(), stack.free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    head = stack.launch(
        "ray-head",
        [
            ray,
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=1",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--ray-client-server-port={client_port}",
            "--block",
        ],
        tmp_path / "logs",
        # As KubeRay's SetContainerTokenAuthEnvVars sets them (no token file in a Ray pod).
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": value, "HOME": str(home)},
    )
    try:
        head.wait_ready(
            lambda: (
                stack.port_open("127.0.0.1", client_port)
                and b"Ray runtime started" in head.log_path.read_bytes()
            ),
            180,
        )
        address = f"ray://127.0.0.1:{client_port}"
        mounted = tmp_path / "secrets" / "auth_token"  # the Secret's key, as the pods mount it
        mounted.parent.mkdir()
        mounted.write_text(value)
        joined = join(home, address, mounted, 3)  # its client server may fail to start once under load
        assert joined.returncode == 0 and "joined 42" in joined.stdout, joined.stderr[-3000:]
        anyone = join(home, address, None, 1, refused=True)
        other = tmp_path / "other"
        other.write_text(secrets.token_hex(32))
        wrong = join(home, address, other, 1, refused=True)
        # Ray Client's server aborts the calls UNAUTHENTICATED (ray/_private/authentication/
        # grpc_authentication_server_interceptor.py); the client retries until its connection
        # timeout. The same address admits the client with the Secret's value, so the token is
        # what differs.
        for refused in (anyone, wrong):
            assert refused.returncode != 0, refused.stdout
            assert "ray client connection timeout" in refused.stderr, refused.stderr[-3000:]
    finally:
        head.stop()
