"""The local stack's Ray head requires its own token, whatever the user's home holds.

Ray (2.60) turns token authentication on for a head started where `~/.ray/auth_token` exists (a
first local `ray.init()` writes it), and a client given an address never turns it on: the README's
`fleet run` then failed with "Authentication token is missing or incorrect". Here the head starts
from a home holding such a token; a client without the stack's token is refused, and one that
presents it joins, also after importing Ray first (which reads its settings at import). A refused
token is said at once, not retried.
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
connect_ray(lambda: ray.init(address=sys.argv[1], log_to_driver=False))
print("joined", ray.cluster_resources()["CPU"])
"""


def join(home: Path, address: str, token: Path | None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-c", JOIN, address, str(token or "")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


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
        assert joined.returncode == 0 and "joined 1.0" in joined.stdout, joined.stderr[-3000:]
        anyone = join(home, address, None)  # Ray itself retries for ~30 s; we do not retry
        assert anyone.returncode != 0, anyone.stdout
        assert "the Ray cluster refused this process's token (presented: none)" in anyone.stderr
        assert "InvalidAuthToken" in anyone.stderr and "Retrying" not in anyone.stderr
    finally:
        head.stop()
