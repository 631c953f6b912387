"""Sensors: approved plans start deliberations; failed deliberation runs publish their outcome."""

from __future__ import annotations

import dagster as dg

from .. import settings
from .planning import build_planning_sensor
from .run_failure import build_run_failure_sensor

PLANNING_START_CHOICES = ("first", "end")


def build_event_sensors(job: dg.UnresolvedAssetJobDefinition) -> list[dg.SensorDefinition]:
    """FLEET_PLANNING_START: where the planning sensor starts without a cursor: `first` (every
    retained plan, the default) or `end` (only plans published from now on)."""
    start = settings.env("FLEET_PLANNING_START", default="first")
    if start not in PLANNING_START_CHOICES:
        raise ValueError(f"FLEET_PLANNING_START must be one of {PLANNING_START_CHOICES}, got {start!r}")
    return [build_planning_sensor(job, start_at_end=start == "end"), build_run_failure_sensor(job)]
