"""The resources of the code location, built from the settings' values: the one place a resource
is added (definitions.py takes them all; the CLI builds the one it needs). FleetSettings
(settings.py) reads the environment and holds values; it builds nothing."""

from __future__ import annotations

import logging

import dagster as dg

from .llm.kinds import KINDS
from .resources.config import KIND_CONFIGS, EngineConfig
from .resources.council import CouncilResource
from .resources.events import NatsResource
from .resources.history import HistoryResource
from .resources.io import DomainIOManager, ParquetIOManager
from .resources.ray_cluster import RayCluster
from .resources.repos import ReposResource
from .resources.turns import RayTurnRunner
from .settings import NATS_SECRETS, FleetSettings


def resources(settings: FleetSettings) -> dict[str, object]:
    """Every resource of the code location."""
    # ray.init(address=None) joins the cluster named by RAY_ADDRESS (`make dev` starts a local
    # head and sets it; KubeRay in production); without it Ray starts a private local instance.
    ray = RayCluster(
        address=settings.ray_address,
        auth_token_path=settings.ray_auth_token_path,
        # Ray's own INFO lines on joining ("Connecting to existing Ray cluster …") are not the
        # user's business: `fleet run` printed two of them in the quick start. Warnings stay.
        ray_init_options={
            "ignore_reinit_error": True,
            "log_to_driver": False,
            "logging_level": logging.WARNING,
        },
    )
    return {
        "ray_cluster": ray,
        "turn_runner": RayTurnRunner(engine=engine(settings), ray_cluster=ray),
        "council": council(settings),
        "repos": repos(settings),
        "io_manager": DomainIOManager(base_path=settings.storage),
        "frames_io_manager": ParquetIOManager(base_path=settings.storage),
        "history": HistoryResource(
            base_path=settings.storage,
            max_age_seconds=settings.retention_seconds,
            workspaces_dir=settings.workspaces_dir,
        ),
        # NATS_URL (+ NATS_TOKEN/USER/PASSWORD/CREDS/TLS_*): `make dev` starts one and sets it.
        "nats": nats(settings),
    }


def engine(settings: FleetSettings) -> EngineConfig:
    """The engine agent turns call: a section per engine kind whose settings are set (`llm.kinds`),
    its secrets read through dg.EnvVar, never values."""
    sections = {}
    for name, kind in KINDS.items():
        values = settings.engine_values(name)
        if values is not None:
            secrets = {
                field: dg.EnvVar(variable)
                for field, variable in kind.secrets.items()
                if variable in settings.engine_secrets_set
            }
            sections[name] = KIND_CONFIGS[name](**values, **secrets)
    return EngineConfig(backend=settings.engine_backend, **sections)


def nats(settings: FleetSettings) -> NatsResource:
    """The NATS resource; its secrets read through dg.EnvVar, so they stay out of run config."""
    secrets = {field: dg.EnvVar(var) for field, var in NATS_SECRETS if field in settings.nats_secrets_set}
    return NatsResource(
        url=settings.nats_url,
        stream_replicas=settings.nats_stream_replicas,
        outbox_path=settings.outbox,
        **secrets,
    )


def council(settings: FleetSettings, councils_file: str | None = None) -> CouncilResource:
    """The council resource; `councils_file` in place of FLEET_COUNCILS_FILE's."""
    return CouncilResource(
        max_tokens=settings.max_tokens,
        councils_file=councils_file or settings.councils_file,
    )


def repos(settings: FleetSettings) -> ReposResource:
    """The repos resource: workspaces, tools and the push of repository tasks."""
    return ReposResource(root=settings.workspaces_dir, push_remote=settings.push_remote)
