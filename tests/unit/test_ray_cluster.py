"""The Ray connection is retried when Ray Client's per-connection server fails to start.

The failure (the head's client proxy losing the server process it just started) cannot be made
to happen on demand with a real head, so `FlakyConnect` (a fake) raises what `ray.init` raised then.
"""

from __future__ import annotations

import pytest

from fleet_pipelines.resources.ray_cluster import connect_ray

SERVER_INIT_FAILURE = ConnectionAbortedError(
    "Initialization failure from server:\npsutil.ZombieProcess: PID still exists but it's a zombie"
)


class FlakyConnect:
    """A fake `ray.init`: fails with `errors` in turn, then connects."""

    def __init__(self, *errors: BaseException):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "connected"


def test_a_connection_that_fails_to_start_its_server_is_tried_again():
    connect = FlakyConnect(SERVER_INIT_FAILURE)
    assert connect_ray(connect, attempts=2) == "connected"
    assert connect.calls == 2


def test_after_the_last_try_the_connection_error_is_raised_as_it_was():
    connect = FlakyConnect(SERVER_INIT_FAILURE, SERVER_INIT_FAILURE)
    with pytest.raises(ConnectionAbortedError, match="Initialization failure from server"):
        connect_ray(connect, attempts=2)
    assert connect.calls == 2


def test_other_errors_are_not_retried():
    connect = FlakyConnect(ValueError("bad ray_init_options"))
    with pytest.raises(ValueError, match="bad ray_init_options"):
        connect_ray(connect, attempts=4)
    assert connect.calls == 1
