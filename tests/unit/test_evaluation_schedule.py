"""The nightly_evaluation schedule, evaluated with Dagster's schedule test helpers."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
import pytest

from fleet_pipelines.assets.evaluation import evaluation_partitions
from fleet_pipelines.schedules.evaluation import build_nightly_evaluation
from fleet_pipelines.settings import FleetSettings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ["FLEET_EVAL_CRON", "FLEET_EVAL_SCHEDULE", "FLEET_EVAL_SAMPLE_SIZE", "FLEET_EVAL_SPLIT"]:
        monkeypatch.delenv(name, raising=False)


def test_off_by_default_with_the_default_cron():
    schedule = build_nightly_evaluation(FleetSettings.from_env())
    assert schedule.name == "nightly_evaluation"
    assert schedule.default_status is dg.DefaultScheduleStatus.STOPPED
    assert schedule.cron_schedule == "0 2 * * *"
    assert schedule.job_name == "evaluation_job"


def test_env_turns_it_on_with_a_cron_from_config(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FLEET_EVAL_SCHEDULE", "on")
    monkeypatch.setenv("FLEET_EVAL_CRON", "30 3 * * 1-5")
    schedule = build_nightly_evaluation(FleetSettings.from_env())
    assert schedule.default_status is dg.DefaultScheduleStatus.RUNNING
    assert schedule.cron_schedule == "30 3 * * 1-5"


def test_a_tick_requests_that_day_s_partition_with_the_configured_sample(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FLEET_EVAL_SAMPLE_SIZE", "7")
    schedule = build_nightly_evaluation(FleetSettings.from_env())
    with dg.DagsterInstance.ephemeral() as instance:
        context = dg.build_schedule_context(
            instance=instance, scheduled_execution_time=datetime(2026, 3, 14, 2, 0, tzinfo=UTC)
        )
        request = schedule(context)
    assert request.partition_key == "2026-03-14" and request.run_key == "2026-03-14"
    assert request.partition_key in evaluation_partitions.get_partition_keys(
        current_time=datetime(2026, 3, 14, 2, 0, tzinfo=UTC)
    )  # the day's own partition exists while that day runs (end_offset=1)
    config = request.run_config["ops"]["evaluation"]["config"]
    assert config == {"suite": "humaneval,repos", "split": "test", "sample_size": 7}
