"""Sensors: approved plans start deliberations; failed deliberation runs publish their outcome;
events kept while NATS was unreachable are sent when it is back."""

from __future__ import annotations

import dagster as dg

from ..settings import FleetSettings
from .outbox import build_outbox_sensor
from .planning import build_planning_sensor
from .run_failure import build_run_failure_sensor


def build_event_sensors(
    job: dg.UnresolvedAssetJobDefinition, settings: FleetSettings
) -> list[dg.SensorDefinition]:
    """`settings.planning_start` (FLEET_PLANNING_START): where the planning sensor starts without a
    cursor: `first` (every retained plan, the default) or `end` (only plans published from now on).
    `settings.planning_wait_s` (FLEET_PLANNING_WAIT_S): how long a tick waits for a plan."""
    return [
        build_planning_sensor(
            job,
            start_at_end=settings.planning_start == "end",
            wait_s=settings.planning_wait_s,
        ),
        build_run_failure_sensor(job),
        build_outbox_sensor(),
    ]
