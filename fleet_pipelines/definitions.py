"""The one Definitions object of the fleet_pipelines code location (its resources: wiring.py)."""

from __future__ import annotations

import dagster as dg

from .assets.decision_log import decision_log, decision_log_job
from .assets.deliberation import build_deliberation_job, deliberation_assets
from .assets.evaluation import evaluation, evaluation_job
from .assets.story import story_decisions
from .schedules.evaluation import build_nightly_evaluation
from .schedules.retention import build_history_schedules, retention_job
from .sensors import build_event_sensors
from .settings import FleetSettings
from .wiring import resources

settings = FleetSettings.from_env()
deliberation_job = build_deliberation_job(settings.engine_id())

defs = dg.Definitions(
    assets=[*deliberation_assets, story_decisions, evaluation, decision_log],
    jobs=[deliberation_job, evaluation_job, decision_log_job, retention_job],
    schedules=[build_nightly_evaluation(settings), *build_history_schedules(settings)],
    sensors=build_event_sensors(deliberation_job, settings),
    resources=resources(settings),
)
