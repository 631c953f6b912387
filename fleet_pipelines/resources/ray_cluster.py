"""The `ray_cluster` resource: dagster-ray's LocalRay, with its connection retried.

`ray.init(address=None)` joins the cluster named by RAY_ADDRESS: `make dev`'s local head, or
`ray://…` (Ray Client) as deploy/ configures runs for KubeRay. Through Ray Client each connection
gets a server process of its own on the head, started by the head's client proxy; under load that
start fails now and then (`ConnectionAbortedError: Initialization failure from server`, the new
server process gone before the proxy could read its command line), as does a connection to a head
whose client server is not listening yet. A run would fail for it, so the connection is retried
(`connect_ray`), with backoff; Ray's client disconnects a failed attempt, so each one starts clean.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from dagster_ray import LocalRay
from pydantic import Field
from tenacity import Retrying, before_sleep_log, retry_if_exception_type, stop_after_attempt, wait_exponential

T = TypeVar("T")
CONNECT_ATTEMPTS = 4
log = logging.getLogger(__name__)


def connect_ray(connect: Callable[[], T], attempts: int = CONNECT_ATTEMPTS) -> T:
    """`connect()` (a `ray.init`), retried on a connection error with 1, 2, 4 … s between tries."""
    retrying = Retrying(
        retry=retry_if_exception_type(ConnectionError),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=1, max=10),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )
    return retrying(connect)


class RayCluster(LocalRay):
    """The Ray cluster the runs' turns go to (RAY_ADDRESS; a private local Ray without it)."""

    address: str | None = Field(
        default=None,
        description="The cluster to join (RAY_ADDRESS, else the running local stack's head); none: "
        "ray.init's own choice, a private local Ray.",
    )

    connect_attempts: int = Field(
        default=CONNECT_ATTEMPTS,
        ge=1,
        description="Tries to connect before the run fails: Ray Client's per-connection server can "
        "fail to start on a loaded head.",
    )

    @property
    def ray_address(self) -> str | None:  # type: ignore[override]
        return self.address

    def connect(self, context: Any) -> Any:
        return connect_ray(self._init, self.connect_attempts)

    def _init(self) -> Any:
        """`ray.init` as LocalRay.connect calls it (its init options, the env vars it injects),
        without its Ray Data settings: applying them imports ray.data in the run and runs a Ray
        task that imports it on a worker, ~2.5 s of every run's start here, and nothing of ours
        uses Ray Data."""
        import ray

        options = dict(self.ray_init_options)
        runtime_env = dict(options.get("runtime_env") or {})
        env_vars = {k: v for k, v in (runtime_env.get("env_vars") or {}).items() if v is not None}
        runtime_env["env_vars"] = {**env_vars, **self.get_env_vars_to_inject()}
        self._context = ray.init(address=self.ray_address, **{**options, "runtime_env": runtime_env})
        return self._context
