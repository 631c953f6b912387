"""The retention age: FLEET_RETENTION_SECONDS, the seed system's DELIBERATION_CLEANUP as alias."""

from __future__ import annotations

import pydantic
import pytest

from fleet_pipelines import wiring
from fleet_pipelines.history.options import DEFAULT_RETENTION_SECONDS
from fleet_pipelines.settings import FleetSettings


def test_default_is_fourteen_days():
    settings = FleetSettings.from_env({})
    assert settings.retention_seconds == DEFAULT_RETENTION_SECONDS == 14 * 24 * 3600
    assert wiring.resources(settings)["history"].max_age_seconds == DEFAULT_RETENTION_SECONDS


def test_seed_alias_is_read():
    assert FleetSettings.from_env({"DELIBERATION_CLEANUP": "3600"}).retention_seconds == 3600


def test_our_name_wins_over_the_alias():
    settings = FleetSettings.from_env({"DELIBERATION_CLEANUP": "3600", "FLEET_RETENTION_SECONDS": "86400"})
    assert settings.retention_seconds == 86400


@pytest.mark.parametrize("value", ["0", "-5", "an hour"])
def test_a_bad_age_is_refused_with_the_variable_named(value: str):
    with pytest.raises(pydantic.ValidationError, match="FLEET_RETENTION_SECONDS"):
        FleetSettings.from_env({"FLEET_RETENTION_SECONDS": value})


def test_the_history_resource_writes_where_the_io_managers_write():
    resources = wiring.resources(FleetSettings.from_env({"FLEET_STORAGE_PATH": "s3://bucket/fleet"}))
    assert resources["history"].base_path == resources["io_manager"].base_path == "s3://bucket/fleet"
