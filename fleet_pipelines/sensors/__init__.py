"""Sensors: approved plans start deliberations; failed deliberation runs publish their outcome."""

from __future__ import annotations

import dagster as dg

from .planning import build_planning_sensor
from .run_failure import build_run_failure_sensor


def build_event_sensors(job: dg.UnresolvedAssetJobDefinition) -> list[dg.SensorDefinition]:
    return [build_planning_sensor(job), build_run_failure_sensor(job)]
