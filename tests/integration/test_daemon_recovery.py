"""The real Dagster daemon and the planning sensor (issue 7): events published while the daemon is
down start runs when it returns; the same event published again (same or new Nats-Msg-Id) and a
reset sensor cursor start no second run.

Runs stay QUEUED (`max_concurrent_runs: 0`): this is about which runs exist, not their execution.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus

from fleet_pipelines import stack
from fleet_pipelines.names import DELIBERATION_JOB
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.sensors.planning import PLANNING_SENSOR
from tests import factories
from tests.integration.test_sensor_planning import publish_raw

REPO = Path(__file__).resolve().parents[2]


def plan(i: int) -> bytes:
    return factories.plan_envelope(f"dr-{i}", factories.plan(f"US-{i}", f"P-{i}")).model_dump_json().encode()


def run_keys(instance: dg.DagsterInstance) -> list[str]:
    """The deliberation runs' keys. The hourly schedules' runs are left out: the retention job's,
    which has no run key, appeared here once when the test spanned minute 35 of an hour."""
    deliberations = instance.get_runs(filters=dg.RunsFilter(job_name=DELIBERATION_JOB))
    return [r.tags.get("dagster/run_key") for r in deliberations]


def wait_for_runs(instance: dg.DagsterInstance, count: int, timeout_s: float = 120) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        keys = run_keys(instance)
        if len(keys) >= count:
            return keys
        time.sleep(1)
    raise AssertionError(f"{len(run_keys(instance))} runs after {timeout_s}s, expected {count}")


def sensor_ticks(instance: dg.DagsterInstance) -> list:
    """The planning sensor's ticks, newest first (none before its first tick)."""
    state = next((s for s in instance.all_instigator_state() if s.name == PLANNING_SENSOR), None)
    return [] if state is None else list(instance.get_ticks(state.instigator_origin_id, state.selector_id))


def wait_for_ticks(instance: dg.DagsterInstance, after: float, count: int, timeout_s: float = 60) -> list:
    """Polls until `count` ticks that began after `after` (time.time()) have ended; returns them.
    The daemon has one tick of a sensor in flight at a time: the ticks before them have ended too."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ended = [t for t in sensor_ticks(instance) if t.timestamp > after and t.status != TickStatus.STARTED]
        if len(ended) >= count:
            return ended
        time.sleep(0.5)
    raise AssertionError(f"not {count} sensor ticks within {timeout_s}s")


def wait_until_no_tick_in_flight(instance: dg.DagsterInstance, since: float, timeout_s: float = 60) -> None:
    """Polls until no tick is in flight, at least a second after `since` (time.time()): a tick the
    daemon chose to start just before then has been recorded by that time, and has ended. Only the
    newest tick can be in flight (a tick the first daemon was stopped in may be left STARTED)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        in_flight = any(t.status == TickStatus.STARTED for t in sensor_ticks(instance)[:1])
        if not in_flight and time.time() >= since + 1:
            return
        time.sleep(0.25)
    raise AssertionError(f"a sensor tick still in flight after {timeout_s}s")


@pytest.mark.heavy(50)
def test_daemon_down_then_back_and_replays_start_no_second_run(nats_resource: NatsResource, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "run_queue:\n  max_concurrent_runs: 0\nsensors:\n  use_threads: true\ntelemetry:\n  enabled: false\n"
    )
    env = {**os.environ, "DAGSTER_HOME": str(home), "NATS_URL": nats_resource.url}
    daemon_cmd = [
        str(Path(sys.executable).with_name("dagster-daemon")),
        "run",
        "-w",
        str(REPO / "workspace.yaml"),
    ]

    def start_daemon() -> stack.Service:
        return stack.launch("dagster-daemon", daemon_cmd, tmp_path / "logs", env)

    instance = dg.DagsterInstance.from_config(str(home))
    daemon = start_daemon()
    try:
        for i in range(3):
            publish_raw(nats_resource, plan(i), msg_id=f"dr-{i}")
        first = wait_for_runs(instance, 3)
    finally:
        daemon.stop()

    # Daemon down: new plans, the same plan again under a new message id, and under the same one.
    for i in range(3, 6):
        publish_raw(nats_resource, plan(i), msg_id=f"dr-{i}")
    publish_raw(nats_resource, plan(0), msg_id="dr-0-resent")  # stored again; same idempotency key
    publish_raw(nats_resource, plan(1), msg_id="dr-1")  # dropped by JetStream's duplicate window

    daemon = start_daemon()
    try:
        wait_for_runs(instance, 6)
        # Nothing else may appear: the tick that started them ends, and a whole tick after it.
        wait_for_ticks(instance, after=time.time(), count=1)
        keys = run_keys(instance)
        assert len(keys) == 6 == len(set(keys))
        assert set(first) < set(keys)

        # An operator resets the cursor: the sensor re-reads the stream from the start. As the README
        # says, with the sensor stopped: a tick in flight (it waits up to 3.5 s for plans) writes
        # back the cursor it began with.
        def sensor_cli(*args: str) -> None:
            dagster = str(Path(sys.executable).with_name("dagster"))
            command = [dagster, "sensor", *args, PLANNING_SENSOR, "-w", str(REPO / "workspace.yaml")]
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)

        sensor_cli("stop")
        wait_until_no_tick_in_flight(instance, since=time.time())  # the tick in flight has ended
        reset_at = time.time()
        sensor_cli("cursor", "--delete")
        sensor_cli("start")
        wait_for_ticks(instance, after=reset_at, count=2)  # at least two ticks after the reset
    finally:
        daemon.stop()
    keys = run_keys(instance)
    assert len(keys) == 6 == len(set(keys)), "a replay started a second run"
    ticks = sensor_ticks(instance)
    assert ticks and all(t.status != TickStatus.FAILURE for t in ticks)
    # After the reset the sensor asked again for every run (it re-read the stream) and the daemon
    # started none of them: their run keys were taken.
    replayed = [t for t in ticks if t.timestamp > reset_at and t.run_keys]
    assert replayed and set().union(*(t.run_keys for t in replayed)) <= set(keys)
    assert not any(t.run_ids for t in replayed)
