"""Nested `dg.Config` of the engine, the scoring weights and the sandbox limits.

Each is derived from the model the code runs with (fields, types, defaults, bounds and
descriptions), so the UI's config and the code cannot disagree: there is no second copy to edit.
`to_model()` gives back the model the code runs with.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

import dagster as dg
from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo

from ..domain.limits import SandboxLimits
from ..domain.scoring import ScoringWeights
from ..llm.settings import EngineSettings, VLLMActorSettings


class DerivedConfig(dg.Config):
    """A config derived from `source` (a pydantic model or a dataclass)."""

    source: typing.ClassVar[type]

    def to_model(self) -> Any:
        return self.source(**self.model_dump())


def derived_fields(
    source: type,
    *,
    exclude: tuple[str, ...] = (),
    overrides: dict[str, tuple[Any, FieldInfo]] | None = None,
    descriptions: dict[str, str] | None = None,
) -> dict[str, tuple[Any, FieldInfo]]:
    """The fields of `source` (a pydantic model or a dataclass), minus `exclude`, with `overrides`."""
    if isinstance(source, type) and issubclass(source, BaseModel):
        fields = {n: (f.annotation, f) for n, f in source.model_fields.items()}
    else:
        hints = typing.get_type_hints(source)
        fields = {
            f.name: (hints[f.name], Field(default=f.default, description=(descriptions or {}).get(f.name)))
            for f in dataclasses.fields(source)
        }
    fields = {n: spec for n, spec in fields.items() if n not in exclude}
    fields.update(overrides or {})
    return fields


def derived_model(source: type, name: str, base: type[BaseModel], **options: Any) -> Any:
    """A subclass of `base` (a dg.Config, a dg.ConfigurableResource) with the fields of `source`."""
    return create_model(name, __base__=base, __doc__=source.__doc__, **derived_fields(source, **options))


def derived_config(source: type, name: str, **options: Any) -> type[DerivedConfig]:
    """A dg.Config class with the fields of `source`; `to_model()` gives back a `source`."""
    cls = derived_model(source, name, DerivedConfig, **options)
    cls.source = source
    return cls


ScoringWeightsConfig = derived_config(ScoringWeights, "ScoringWeightsConfig")
SandboxLimitsConfig = derived_config(
    SandboxLimits,
    "SandboxLimitsConfig",
    descriptions={
        "wall_s": "Wall-clock limit of one test run.",
        "cpu_s": "CPU-seconds limit of one test run.",
        "memory_mb": "Memory limit in MiB of the whole sandbox (its cgroup, shared memory included) "
        "and of each process's address space; where no cgroup is writable, address space x "
        "processes + the tmpfs sizes are shrunk to fit it (or the run is refused).",
        "max_processes": "Process limit of the whole sandbox (its cgroup; RLIMIT_NPROC in its own "
        "user namespace where no cgroup is writable, then at most what memory_mb holds).",
        "max_file_mb": "Largest file a test run may write, MiB.",
        "max_output_chars": "Output kept from a test run.",
        "work_dir_mb": "Size of the tmpfs work dir (and of /dev/shm) in MiB; where no cgroup is "
        "writable, at most a quarter of memory_mb for both.",
        "cpus": "CPU bandwidth of the whole sandbox in cores (its cgroup).",
    },
)
VLLMActorConfig = derived_config(VLLMActorSettings, "VLLMActorConfig")
# The key is a plain string in config so that dg.EnvVar('FLEET_LLM_API_KEY') can hold it.
OpenAIEngineConfig = derived_config(
    EngineSettings,
    "OpenAIEngineConfig",
    overrides={
        "api_key": (
            str | None,
            Field(
                default=None, description="API key; dg.EnvVar('FLEET_LLM_API_KEY') keeps it out of the UI."
            ),
        )
    },
)


class EngineConfig(dg.Config):
    """The engine agent turns call: an OpenAI-compatible server, or vLLM's engine in a Ray actor."""

    backend: Literal["openai", "vllm_actor"] = Field(
        default="openai",
        description="openai: turns call `openai` over HTTP; vllm_actor: turns go to the vLLM engine actor.",
    )
    openai: OpenAIEngineConfig = Field(
        description="The OpenAI-compatible engine (llama.cpp, vLLM, Ray Serve)."
    )
    vllm_actor: VLLMActorConfig | None = Field(
        default=None, description="The vLLM engine actor, required when backend is vllm_actor."
    )

    @property
    def model_name(self) -> str:
        """The model name recorded on every turn."""
        return self.vllm_actor.served_model_name if self.backend == "vllm_actor" else self.openai.model

    def to_model(self) -> EngineSettings | VLLMActorSettings:
        if self.backend == "openai":
            return self.openai.to_model()
        if self.vllm_actor is None:
            raise dg.Failure("engine backend is vllm_actor but the engine has no vllm_actor config")
        return self.vllm_actor.to_model()
