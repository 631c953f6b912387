"""The one settings object: every environment variable the platform reads, as values (the
resources are built from them in wiring.py). The seed system's variable names are accepted as
aliases.

Light on purpose (pydantic only at import): the CLI reads it before deciding what else to import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from .domain.councils import CouncilSettings, engine_id
from .domain.tools import ToolProtocol
from .events.options import ConnectOptions, StreamOptions
from .history.options import RetentionOptions
from .llm.local_server import MODEL_NAME
from .llm.settings import EngineSettings, VLLMActorSettings
from .stack_file import with_stack

DEFAULT_LLM_URL = "http://127.0.0.1:8080/v1"
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
LLM_API_KEY = "FLEET_LLM_API_KEY"


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


def _supplies(model: type[BaseModel], field: str, *env: str, **overrides: Any) -> Any:
    """A setting that supplies `model.field`, read from the variables `env`: it is validated with
    that field's type bounds and described by its description, so neither is written twice."""
    return FieldInfo.merge_field_infos(model.model_fields[field], validation_alias=_env(*env), **overrides)


class FleetSettings(BaseModel):
    """Everything configurable from the environment, as values. `FleetSettings.from_env()` reads
    it once; `wiring.resources(settings)` builds every resource of the code location from it."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    # The engine: each value supplies a field of the engine's settings (its description and bounds)
    llm_base_url: str = _supplies(
        EngineSettings, "base_url", "FLEET_LLM_BASE_URL", "VLLM_URL", default=DEFAULT_LLM_URL
    )
    llm_model: str = _supplies(EngineSettings, "model", "FLEET_LLM_MODEL", "VLLM_MODEL", default=MODEL_NAME)
    llm_api_key_set: bool = Field(default=False, description=f"{LLM_API_KEY} is set (read via dg.EnvVar).")
    max_tokens: int | None = _supplies(CouncilSettings, "max_tokens", "FLEET_MAX_TOKENS")
    engine_slots: int | None = _supplies(EngineSettings, "slots", "FLEET_ENGINE_SLOTS")
    tool_protocol: ToolProtocol = _supplies(EngineSettings, "tool_protocol", "FLEET_TOOL_PROTOCOL")
    engine_backend: Literal["openai", "vllm_actor"] = Field(
        default="openai", validation_alias=_env("FLEET_ENGINE_BACKEND")
    )
    model_source: str | None = Field(
        default=None,
        validation_alias=_env("FLEET_MODEL_SOURCE"),
        description="Object-store URL of the served model folder (`fleet model pull`).",
    )
    # The vLLM engine actor (unset: the actor's own defaults)
    vllm_model: str | None = _supplies(VLLMActorSettings, "model", "FLEET_VLLM_MODEL", default=None)
    vllm_num_gpus: float | None = _supplies(
        VLLMActorSettings, "num_gpus", "FLEET_VLLM_NUM_GPUS", default=None
    )
    vllm_num_cpus: float | None = _supplies(
        VLLMActorSettings, "num_cpus", "FLEET_VLLM_NUM_CPUS", default=None
    )
    vllm_dtype: str | None = _supplies(VLLMActorSettings, "dtype", "FLEET_VLLM_DTYPE", default=None)
    vllm_enforce_eager: bool | None = _supplies(
        VLLMActorSettings, "enforce_eager", "FLEET_VLLM_ENFORCE_EAGER", default=None
    )
    vllm_cpu_kvcache_gib: int | None = _supplies(
        VLLMActorSettings, "cpu_kvcache_space_gib", "FLEET_VLLM_CPU_KVCACHE_GIB", default=None
    )
    vllm_cache_root: str | None = _supplies(
        VLLMActorSettings, "cache_root", "FLEET_VLLM_CACHE_ROOT", default=None
    )
    vllm_max_num_seqs: int | None = _supplies(
        VLLMActorSettings, "max_num_seqs", "FLEET_VLLM_MAX_NUM_SEQS", default=None
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
        here reads is refused (ValueError) with what replaces it."""
        environ = os.environ if environ is None else environ
        present = {k: v for k, v in environ.items() if v}
        if replaced := [f"{name}: {why}" for name, why in REPLACED_VARIABLES.items() if name in present]:
            raise ValueError("; ".join(replaced))
        present = with_stack(present, Path(present.get("FLEET_STATE_DIR", ".fleet")))
        return cls.model_validate(
            {
                **present,
                "llm_api_key_set": LLM_API_KEY in present,
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

    def engine_id(self) -> str:
        """Which engine the deliberations use, as a run tag value (`fleet/engine`, the run queue
        limits runs per engine): the vLLM model of the engine actor, or the server's host:port."""
        if self.engine_backend == "vllm_actor":
            return f"vllm-actor:{Path(self.vllm_model or 'none').name}"
        return engine_id(self.llm_base_url)

    def nats_options(self) -> ConnectOptions:
        """How to reach NATS, its secrets read from the environment now: for commands that talk
        to NATS without Dagster (the `nats` resource reads them through dg.EnvVar instead)."""
        secrets = {field: os.environ[var] for field, var in NATS_SECRETS if field in self.nats_secrets_set}
        return ConnectOptions(url=self.nats_url, **secrets)
