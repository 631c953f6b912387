"""The one settings object: every environment variable the platform reads, as values (the
resources are built from them in wiring.py). The seed system's variable names are accepted as
aliases.

Light on purpose (pydantic only at import): the CLI reads it before deciding what else to import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from .domain.councils import CouncilSettings
from .events.options import ConnectOptions, StreamOptions
from .history.options import RetentionOptions
from .llm.kinds import DEFAULT_KIND, KINDS, backends
from .stack_file import with_stack

DEFAULT_TIMEOUT_SECONDS = 300.0
# The old system's variables that nothing here reads: refused at start-up, saying what replaces them.
REPLACED_VARIABLES = {
    "ENABLE_NATS": "NATS is always on here: set NATS_URL (or run `make dev`), and unset ENABLE_NATS",
    "AGENT_TYPE": "a council's role comes from each task (`role`), its agents from the councils file "
    "(FLEET_COUNCILS_FILE): unset AGENT_TYPE",
}
# Secrets are never values here: settings only note that they are set, and the resources read
# them through dg.EnvVar, so they stay out of run config, the UI and the event log.
NATS_SECRETS = (
    ("token", "NATS_TOKEN"),
    ("user", "NATS_USER"),
    ("password", "NATS_PASSWORD"),
    ("creds_file", "NATS_CREDS"),
    ("tls_ca_file", "NATS_TLS_CA"),
    ("tls_cert_file", "NATS_TLS_CERT"),
    ("tls_key_file", "NATS_TLS_KEY"),
)
ENGINE_SECRETS = tuple(var for kind in KINDS.values() for var in kind.secrets.values())
# Secrets a deployment may mount as files (a Kubernetes Secret volume) instead of variables:
# NAME_FILE names the file NAME is read from where NAME itself is unset (deploy/README.md, "Secrets").
SECRET_FILE_VARIABLES = (
    *ENGINE_SECRETS,
    "NATS_USER",
    "NATS_PASSWORD",
    "FLEET_GIT_TOKEN",
    "FLEET_PUSH_REMOTE",
)
EngineBackend = backends()


def read_secret_files(environ: MutableMapping[str, str]) -> None:
    """Sets each variable of SECRET_FILE_VARIABLES that is unset from the file its NAME_FILE names
    (a trailing newline dropped), in `environ` (the process's own: every reader, dg.EnvVar
    included, then sees it as a variable)."""
    for name in SECRET_FILE_VARIABLES:
        path = environ.get(f"{name}_FILE")
        if path and not environ.get(name):
            environ[name] = Path(path).read_text().removesuffix("\n")


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


def _supplies(model: type[BaseModel], field: str, *env: str, **overrides: Any) -> Any:
    """A setting that supplies `model.field`, read from the variables `env`: it is validated with
    that field's type bounds and described by its description, so neither is written twice."""
    return FieldInfo.merge_field_infos(model.model_fields[field], validation_alias=_env(*env), **overrides)


def engine_variables() -> dict[str, Any]:
    """A setting per variable of the registered engine kinds (`llm.kinds`), named by
    `Variable.setting`, supplying its kind's field; unset, its default (None: the kind's own)."""
    fields: dict[str, Any] = {}
    for kind in KINDS.values():
        for field, variable in kind.variables.items():
            if variable.setting not in fields:  # read by an earlier kind: one setting
                annotation = kind.settings.model_fields[field].annotation
                fields[variable.setting] = (
                    annotation if variable.default is not None else annotation | None,
                    _supplies(kind.settings, field, *variable.names, default=variable.default),
                )
    return fields


EngineVariables = create_model(
    "EngineVariables",
    __doc__="The variables of every registered engine kind, each a setting (`engine_variables`).",
    **engine_variables(),
)


class FleetSettings(EngineVariables):
    """Everything configurable from the environment, as values. `FleetSettings.from_env()` reads
    it once; `wiring.resources(settings)` builds every resource of the code location from it."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    # The engine: its kind; each kind's variables are the fields of EngineVariables
    engine_backend: EngineBackend = Field(
        default=DEFAULT_KIND,
        validation_alias=_env("FLEET_ENGINE_BACKEND"),
        description="The kind of engine agent turns go to: "
        + "; ".join(f"{name}: {kind.description}" for name, kind in KINDS.items()),
    )
    engine_secrets_set: tuple[str, ...] = Field(
        default=(), description="The engine kinds' secret variables that are set (read via dg.EnvVar)."
    )
    max_tokens: int | None = _supplies(CouncilSettings, "max_tokens", "FLEET_MAX_TOKENS")
    model_source: str | None = Field(
        default=None,
        validation_alias=_env("FLEET_MODEL_SOURCE"),
        description="Object-store URL of the served model folder (`fleet model pull`).",
    )
    councils_file: str | None = Field(
        default=None,
        validation_alias=_env("FLEET_COUNCILS_FILE"),
        description="YAML councils file: per role agents, engine and model, budgets, rubric, weights.",
    )
    # Repository tasks
    workspaces_dir: str = Field(
        default="",
        validation_alias=_env("FLEET_WORKSPACES_DIR"),
        description="Read-only workspaces of repository tasks (default `<tmp>/fleet-workspaces`); every "
        "folder above it must be traversable by other users (the sandbox's uids).",
    )
    push_remote: str = Field(
        default="",
        validation_alias=_env("FLEET_PUSH_REMOTE"),
        description="Git remote the winning patch of a repository task is pushed to as `fleet/{task_id}`.",
    )
    # Where state lives
    state_dir: Path = Field(
        default=Path(".fleet"),
        validation_alias=_env("FLEET_STATE_DIR"),
        description="Local stack state (models, logs, NATS store, Dagster home, asset values).",
    )
    storage_path: str | None = Field(
        default=None,
        validation_alias=_env("FLEET_STORAGE_PATH"),
        description="Where asset values are stored (default <state_dir>/storage; s3://… works).",
    )
    dagster_home: Path | None = Field(default=None, validation_alias=_env("DAGSTER_HOME"))
    deliberation_timeout_s: float = Field(
        default=DEFAULT_TIMEOUT_SECONDS,
        gt=0,
        le=3_600,
        validation_alias=_env("FLEET_DELIBERATION_TIMEOUT", "DELIBERATION_TIMEOUT"),
        description="Deadline of a deliberation whose task gives no `timeout_seconds` (launchpad default).",
    )
    ray_address: str | None = Field(
        default=None,
        validation_alias=_env("RAY_ADDRESS"),
        description="The Ray cluster agent turns run on (default: a private local Ray).",
    )
    ray_auth_token_path: str | None = Field(
        default=None,
        validation_alias=_env("RAY_AUTH_TOKEN_PATH"),
        description="Token file presented to that cluster (the local stack's head requires its own); "
        "none: Ray's own settings.",
    )
    # NATS
    nats_url: str | None = _supplies(ConnectOptions, "url", "NATS_URL")
    nats_secrets_set: tuple[str, ...] = Field(
        default=(), description="Resource fields whose NATS_* variable is set (read via dg.EnvVar)."
    )
    nats_stream_replicas: int = _supplies(StreamOptions, "stream_replicas", "FLEET_NATS_REPLICAS")
    planning_start: Literal["first", "end"] = Field(
        default="first",
        validation_alias=_env("FLEET_PLANNING_START"),
        description="Where the planning sensor starts without a cursor: every retained plan, or the end.",
    )
    planning_wait_s: float = Field(
        default=3.5,
        ge=0,
        le=4.5,
        validation_alias=_env("FLEET_PLANNING_WAIT_S"),
        description="How long a planning sensor tick with nothing to read waits for a plan to be "
        "published (Dagster evaluates sensors every 5 s; 0: read and return).",
    )
    # Retention: deliberations leave the partition set; the decision log keeps their outcomes
    retention_seconds: float = _supplies(
        RetentionOptions, "max_age_seconds", "FLEET_RETENTION_SECONDS", "DELIBERATION_CLEANUP"
    )
    retention_cron: str = Field(
        default="35 * * * *",
        validation_alias=_env("FLEET_RETENTION_CRON"),
        description="When the retention job runs (UTC).",
    )
    # The nightly evaluation
    eval_schedule: str = Field(default="off", validation_alias=_env("FLEET_EVAL_SCHEDULE"))
    eval_cron: str = Field(default="0 2 * * *", validation_alias=_env("FLEET_EVAL_CRON"))
    eval_suite: str = Field(
        default="humaneval,repos",
        validation_alias=_env("FLEET_EVAL_SUITE"),
        description="Suites of the nightly run, comma-separated, each sampled on its own.",
    )
    eval_split: str = Field(default="test", validation_alias=_env("FLEET_EVAL_SPLIT"))
    eval_sample_size: int = Field(default=20, validation_alias=_env("FLEET_EVAL_SAMPLE_SIZE"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FleetSettings:
        """The settings from the environment, over what the running local stack recorded
        (`stack_file`); empty variables count as unset. A variable of the old system that nothing
        here reads is refused (ValueError) with what replaces it. The process's own environment
        first takes the secrets mounted as files (`read_secret_files`)."""
        if environ is None:
            read_secret_files(os.environ)
        environ = os.environ if environ is None else environ
        present = {k: v for k, v in environ.items() if v}
        if replaced := [f"{name}: {why}" for name, why in REPLACED_VARIABLES.items() if name in present]:
            raise ValueError("; ".join(replaced))
        present = with_stack(present, Path(present.get("FLEET_STATE_DIR", ".fleet")))
        return cls.model_validate(
            {
                **present,
                "engine_secrets_set": tuple(var for var in ENGINE_SECRETS if var in present),
                "nats_secrets_set": tuple(field for field, var in NATS_SECRETS if var in present),
            }
        )

    @property
    def state_path(self) -> Path:
        return self.state_dir.resolve()

    @property
    def storage(self) -> str:
        return self.storage_path or str(self.state_path / "storage")

    @property
    def outbox(self) -> str:
        """Where runs keep the events NATS did not take, beside the asset values."""
        return f"{self.storage.rstrip('/')}/outbox"

    @property
    def eval_schedule_running(self) -> bool:
        return self.eval_schedule.lower() in {"on", "1", "true", "running"}

    def dagster_home_path(self) -> Path:
        return (self.dagster_home or self.state_path / "dagster_home").resolve()

    def engine_values(self, name: str) -> dict[str, Any] | None:
        """The values of engine kind `name`'s settings that its variables set (unset ones left to
        the settings' defaults); None when one its settings require is unset."""
        kind = KINDS[name]
        values = {field: getattr(self, v.setting) for field, v in kind.variables.items()}
        values = {field: value for field, value in values.items() if value is not None}
        required = {field for field, info in kind.settings.model_fields.items() if info.is_required()}
        return values if required <= values.keys() else None

    def engine_id(self) -> str:
        """Which engine the deliberations use, as a run tag value (`fleet/engine`, the run queue
        limits runs per engine): its kind's (`EngineKind.engine_id`; the server's host:port, the
        vLLM model of the engine actor), `<backend>:unconfigured` when its settings are incomplete
        (its runs fail on their first turn)."""
        kind, values = KINDS[self.engine_backend], self.engine_values(self.engine_backend)
        return (
            f"{self.engine_backend}:unconfigured"
            if values is None
            else kind.engine_id(kind.settings(**values))
        )

    def nats_options(self) -> ConnectOptions:
        """How to reach NATS, its secrets read from the environment now: for commands that talk
        to NATS without Dagster (the `nats` resource reads them through dg.EnvVar instead)."""
        secrets = {field: os.environ[var] for field, var in NATS_SECRETS if field in self.nats_secrets_set}
        return ConnectOptions(url=self.nats_url, **secrets)
