"""The deliberation's resources and job, built one way for every test that runs the job in process:
the scripted (or a recording) turn runner, the council, repositories, storage and NATS."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import dagster as dg

from fleet_pipelines.assets.deliberation import (
    build_deliberation_job,
    deliberation_assets,
    deliberation_run_config,
)
from fleet_pipelines.assets.partitions import deliberation_partitions
from fleet_pipelines.names import DELIBERATION_JOB
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.resources.io import DomainIOManager
from fleet_pipelines.resources.repos import ReposResource
from fleet_pipelines.resources.turns import TurnRunnerResource


def deliberation_resources(
    storage: Path,
    nats: str | NatsResource,
    turn_runner: TurnRunnerResource,
    council: CouncilResource | None = None,
    repos: ReposResource | None = None,
) -> dict:
    """What `deliberation_job` needs: the values stored under `storage` (the outbox beside them
    where `nats` is a URL), events to `nats`."""
    return {
        "turn_runner": turn_runner,
        "council": council or CouncilResource(),
        "repos": repos or ReposResource(),
        "io_manager": DomainIOManager(base_path=str(storage)),
        "nats": nats
        if isinstance(nats, NatsResource)
        else NatsResource(url=nats, outbox_path=f"{storage}/outbox"),
    }


def deliberation_defs(resources: dict, assets: Sequence = ()) -> dg.Definitions:
    """The deliberation's assets (and `assets` beside them) with its job, on `resources`."""
    return dg.Definitions(
        assets=[*deliberation_assets, *assets], jobs=[build_deliberation_job()], resources=resources
    )


def run_deliberation(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    task_id: str,
    task_fields: dict,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    """One deliberation_job run of partition `task_id` in `instance`."""
    instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
    return defs.resolve_job_def(DELIBERATION_JOB).execute_in_process(
        run_config=deliberation_run_config(task_fields),
        instance=instance,
        partition_key=task_id,
        raise_on_error=raise_on_error,
    )
