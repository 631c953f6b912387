"""Shared fixtures: the real local stack (llama.cpp server, Ray head, NATS, Dagster instance).

Every test session starts its own servers on free ports with state in temp dirs, so tests never
collide with `make dev`, the machine's own services, or each other; only the tests that ask for a
server start it. A unit test that asks for the real nats-server (`nats_server`, `nats_resource`)
is marked `nats` here and belongs to the integration tier: the unit tier (`make test-unit`, `-m
"not nats"`) starts no server. SIGTERM and SIGHUP (`timeout`, a closed terminal) end a session as
Ctrl-C does, its fixtures stopping the servers they started.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from fleet_pipelines import stack
from fleet_pipelines.stack_file import ray_auth_env

if TYPE_CHECKING:  # Dagster and the wiring are imported where a fixture needs them: pytest-xdist's
    import dagster as dg  # controller process collects nothing and so never imports them (~1 s)

# The cyclic garbage collector runs every 100,000 allocations net of frees, not every 700: each
# xdist worker imports Dagster, Ray and ~90 test modules (millions of objects, nearly all kept),
# and the collector's passes over them were ~11% of the unit tier's CPU (26.1 s against 29.3 s
# of user and system time). Garbage is still collected, in larger batches.
gc.set_threshold(100_000, 50, 100)

# Every Ray head of the session requires this token and every process of it presents it (as
# `make dev`'s stack does): set before any test module imports Ray, which reads it then.
_RAY_DIR = Path(tempfile.mkdtemp(prefix="fleet-tests-ray-"))
atexit.register(shutil.rmtree, _RAY_DIR, True)
RAY_TOKEN = stack.ray_auth_token(_RAY_DIR)
os.environ.update(ray_auth_env(RAY_TOKEN))

NATS_FIXTURES = {"nats_server", "nats_resource"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "nats: asks for the real nats-server: the integration tier (set here, by fixture)"
    )
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.default_int_handler)


INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`nats` on the unit tests that ask for the real nats-server (`make test-unit` leaves them
    out), `integration` on every test of tests/integration (`-m integration` runs that tier)."""
    for item in items:
        if NATS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.nats)
        if item.path.is_relative_to(INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)


_LEFT_ENTERED: list[str] = []  # the first test after which an entered instance was found


@pytest.fixture(autouse=True)
def no_dagster_instance_left_entered(request: pytest.FixtureRequest) -> Iterator[None]:
    """The first test after which a Dagster instance is left entered fails here, by name: its
    storage stays in Dagster's context variable and fails a later test's definitions load, far
    from the cause (once only: the variable cannot be emptied from here)."""
    from fleet_pipelines.dagster_private import defs_state_storage_in_context

    yield
    if not _LEFT_ENTERED and defs_state_storage_in_context() is not None:
        _LEFT_ENTERED.append(request.node.nodeid)
        pytest.fail(
            "a Dagster instance was left entered by this test or one before it (a context built "
            "from an instance ref and not closed?): use `with`"
        )


@pytest.fixture(scope="session")
def ray_token() -> Path:
    """The token file every Ray head of the session requires."""
    return RAY_TOKEN


@pytest.fixture(scope="session")
def stack_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack-logs")


@pytest.fixture(scope="session")
def llm_server(stack_logs: Path) -> Iterator[str]:
    """A real llama.cpp server (SmolLM2-135M) speaking the OpenAI API; yields its base URL."""
    port = stack.free_port()
    service = stack.start_model_server(stack_logs, port, parallel=3)
    yield f"http://127.0.0.1:{port}/v1"
    service.stop()


@pytest.fixture(scope="session")
def ray_head(stack_logs: Path) -> Iterator[str]:
    """A real Ray head (ray start --head); RAY_ADDRESS points at it for the session."""
    port = stack.free_port()
    service = stack.start_ray_head(stack_logs, port, RAY_TOKEN)
    address = f"127.0.0.1:{port}"
    previous = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = address
    yield address
    import ray

    ray.shutdown()
    service.stop()
    if previous is None:
        os.environ.pop("RAY_ADDRESS", None)
    else:
        os.environ["RAY_ADDRESS"] = previous


@pytest.fixture(scope="session")
def nats_server(stack_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real nats-server with JetStream (~20 ms to start); NATS_URL points at it for the session,
    so every run that publishes events (and every `fleet` subprocess) uses it, never :4222."""
    port = stack.free_port()
    service = stack.start_nats(stack_logs, port, tmp_path_factory.mktemp("nats-store"))
    url = f"nats://127.0.0.1:{port}"
    previous = os.environ.get("NATS_URL")
    os.environ["NATS_URL"] = url
    yield url
    service.stop()
    if previous is None:
        os.environ.pop("NATS_URL", None)
    else:
        os.environ["NATS_URL"] = previous


@pytest.fixture
def nats_resource(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """The events resource on a nats-server of the test's own (~20 ms to start, an empty JetStream
    store); NATS_URL points at it for the test, so its `fleet` subprocesses and runs use it too.

    Not the session's server with its streams deleted: a stream deleted twice in quick succession
    comes back with the deleted messages (test_nats_streams.py pins why), which put a test's
    plans in the next test's stream in two CI runs."""
    from fleet_pipelines.resources.events import NatsResource

    where = tmp_path_factory.mktemp("nats")
    port = stack.free_port()
    service = stack.start_nats(where / "logs", port, where / "store")
    url = f"nats://127.0.0.1:{port}"
    monkeypatch.setenv("NATS_URL", url)
    yield NatsResource(url=url)
    service.stop()


@pytest.fixture
def dagster_instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    """A real (SQLite) Dagster instance in a temp dir."""
    import dagster as dg

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        yield instance


@pytest.fixture
def stack_env(
    llm_server: str,
    ray_head: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> dict:
    """Environment that points the code location at the test stack; returns its resources. A
    test that also asks for `nats_resource` gets resources that publish to that server, whatever
    the order of its arguments."""
    from fleet_pipelines import wiring
    from fleet_pipelines.settings import FleetSettings

    if "nats_resource" in request.fixturenames:
        request.getfixturevalue("nats_resource")  # sets NATS_URL before the resources read it
    monkeypatch.setenv("FLEET_LLM_BASE_URL", llm_server)
    monkeypatch.setenv("FLEET_STORAGE_PATH", str(tmp_path / "storage"))
    monkeypatch.setenv("FLEET_MAX_TOKENS", os.environ.get("FLEET_TEST_MAX_TOKENS", "64"))
    return wiring.resources(FleetSettings.from_env())


@pytest.fixture
def traversable_dir() -> Iterator[Path]:
    """A folder the sandbox's uids can traverse (pytest's tmp_path is root-only), removed after
    the test even where a workspace in it was made read-only."""
    import shutil
    import tempfile

    from fleet_pipelines.workspace.checkout import make_writable

    made = Path(tempfile.mkdtemp(prefix="fleet-test-"))
    os.chmod(made, 0o755)
    yield made
    make_writable(made)
    shutil.rmtree(made, ignore_errors=True)
