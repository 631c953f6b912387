"""FLEET_PLANNING_START=end: a first start skips the plans already retained in the stream."""

from __future__ import annotations

import pytest

from fleet_pipelines.assets.deliberation import build_deliberation_job
from fleet_pipelines.sensors.planning import build_planning_sensor
from fleet_pipelines.settings import FleetSettings
from tests.integration.test_sensor_planning import publish_raw, seq, tick
from tests.unit.test_events import ENVELOPED, LEGACY


def test_start_at_end_skips_retained_plans_then_runs_new_ones(
    dagster_instance, nats_resource, monkeypatch: pytest.MonkeyPatch
):
    from tests.integration import test_sensor_planning

    sensor = build_planning_sensor(build_deliberation_job(), start_at_end=True)
    monkeypatch.setattr(test_sensor_planning, "SENSOR", sensor)  # `tick` evaluates it like the daemon
    publish_raw(nats_resource, LEGACY)  # retained from before the first start: not run

    requests, cursor, skip, _ = tick(dagster_instance, nats_resource, None)
    assert seq(cursor) == 1 and requests == [] and "starting after" in skip
    publish_raw(nats_resource, ENVELOPED, msg_id="b7c1")
    requests, cursor, _, _ = tick(dagster_instance, nats_resource, cursor)
    assert seq(cursor) == 2
    assert [r.tags["fleet/plan_id"] for r in requests] == ["P-43"]


def test_an_unknown_start_setting_is_refused_by_name(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FLEET_PLANNING_START", "latest")
    with pytest.raises(ValueError, match="FLEET_PLANNING_START\n  Input should be 'first' or 'end'"):
        FleetSettings.from_env()
