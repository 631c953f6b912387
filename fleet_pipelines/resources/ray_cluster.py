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
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from dagster_ray import LocalRay
from dagster_ray.configs import RayDataExecutionOptions
from pydantic import Field
from tenacity import Retrying, before_sleep_log, retry_if_exception, stop_after_attempt, wait_exponential

from ..stack_file import ray_auth_env

T = TypeVar("T")
CONNECT_ATTEMPTS = 4
log = logging.getLogger(__name__)


def token_refused(exc: BaseException) -> bool:
    """Whether a failed connection was the cluster refusing this process's token (Ray raises a
    ConnectionError whose cause carries the AuthenticationError, or its text)."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def connect_ray(connect: Callable[[], T], attempts: int = CONNECT_ATTEMPTS) -> T:
    """`connect()` (a `ray.init`), retried on a connection error with 1, 2, 4 … s between tries;
    a refused token is not retried: it is said at once, with the token file presented."""
    retrying = Retrying(
        retry=retry_if_exception(lambda e: isinstance(e, ConnectionError) and not token_refused(e)),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=1, max=10),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )
    try:
        return retrying(connect)
    except ConnectionError as exc:
        if not token_refused(exc):
            raise
        presented = os.environ.get("RAY_AUTH_TOKEN_PATH") or (
            "RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else "none"
        )
        raise ConnectionError(
            f"the Ray cluster refused this process's token (presented: {presented}): it requires "
            "one this process does not have. `make dev`'s head takes .fleet/ray/auth_token of its "
            "folder, which commands run there present; another cluster's goes in RAY_AUTH_TOKEN_PATH"
        ) from exc


def present_ray_token(path: str) -> None:
    """This process presents the token file `path` to the Ray clusters it joins from now on.

    Ray reads RAY_AUTH_MODE and RAY_AUTH_TOKEN_PATH once, when it is imported; a process that has
    imported it already is made to read them again, as Ray's own `_enable_token_auth` does (private
    Ray: `tests/integration/test_ray_auth.py` fails by name when an upgrade changes it)."""
    wanted = ray_auth_env(path)
    if all(os.environ.get(k) == v for k, v in wanted.items()):
        return
    os.environ.update(wanted)
    if "ray" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


class WithoutRayData(RayDataExecutionOptions):
    """dagster-ray's Ray Data settings, not applied: applying them imports `ray.data` in the run
    and in a Ray task on a worker, ~2.5 s of every run's start here, and nothing of ours uses Ray
    Data. The rest of `LocalRay.connect` (init options, env vars) is kept as it is."""

    def apply(self) -> None:
        pass

    def apply_remote(self) -> None:
        pass


class RayCluster(LocalRay):
    """The Ray cluster the runs' turns go to (RAY_ADDRESS; a private local Ray without it)."""

    data_execution_options: WithoutRayData = Field(
        default_factory=WithoutRayData, description="Not applied: nothing here uses Ray Data."
    )

    address: str | None = Field(
        default=None,
        description="The cluster to join (RAY_ADDRESS, else the running local stack's head); none: "
        "ray.init's own choice, a private local Ray.",
    )

    auth_token_path: str | None = Field(
        default=None,
        description="Token file presented to a cluster that requires one (RAY_AUTH_TOKEN_PATH; the "
        "local stack's head always does, and records its file); none: Ray's own settings "
        "(RAY_AUTH_MODE, RAY_AUTH_TOKEN).",
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
        if self.auth_token_path:
            present_ray_token(self.auth_token_path)
        return connect_ray(lambda: LocalRay.connect(self, context), self.connect_attempts)
