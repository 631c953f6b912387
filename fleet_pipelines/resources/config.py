"""Nested `dg.Config` of the engine (one section per engine kind), the scoring weights and the
sandbox limits.

Each is derived from the model the code runs with (fields, types, defaults, bounds and
descriptions), so the UI's config and the code cannot disagree: there is no second copy to edit.
`to_model()` gives back the model the code runs with.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo

from ..domain.limits import SandboxLimits
from ..domain.scoring import ScoringWeights
from ..llm.kinds import DEFAULT_KIND, KINDS, AnyEngineSettings, backends, kind_of


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
        "memory_mb": "Memory limit in MiB of the whole sandbox (its cgroup, shared memory included); "
        "each process's address space is that plus 72 MiB per process allowed (a thread reserves "
        "a malloc arena and a stack it does not touch); where no cgroup is writable, address "
        "space x processes + the tmpfs sizes are shrunk to fit it (or the run is refused).",
        "max_processes": "Process limit of the whole sandbox, threads included (its cgroup; "
        "RLIMIT_NPROC in its own user namespace where no cgroup is writable, then at most what "
        "memory_mb holds).",
        "max_file_mb": "Largest file a test run may write, MiB.",
        "max_output_chars": "Output kept from a test run.",
        "work_dir_mb": "Size of the tmpfs work dir (and of /dev/shm) in MiB; where no cgroup is "
        "writable, at most a quarter of memory_mb for both.",
        "cpus": "CPU bandwidth of the whole sandbox in cores (its cgroup).",
    },
)


def kind_config(name: str) -> type[DerivedConfig]:
    """The config of engine kind `name`'s settings. Its secrets are plain strings in config, so
    that dg.EnvVar can hold them (kept out of the UI)."""
    kind = KINDS[name]
    secrets = {
        field: (
            str | None,
            Field(
                default=None,
                description=f"{kind.settings.model_fields[field].description} dg.EnvVar('{variable}') "
                "keeps it out of the UI.",
            ),
        )
        for field, variable in kind.secrets.items()
    }
    title = "".join(part.capitalize() for part in name.split("_"))
    return derived_config(kind.settings, f"{title}EngineConfig", overrides=secrets)


KIND_CONFIGS = {name: kind_config(name) for name in KINDS}
# The OpenAI-compatible engine's: a council's own engine (`EngineEntry`) borrows how patiently it
# is called from it.
OpenAIEngineConfig = KIND_CONFIGS["openai"]


class EngineConfigBase(dg.Config):
    """What `EngineConfig` does with its sections."""

    @property
    def model_name(self) -> str:
        """The model name recorded on every turn."""
        return kind_of(settings := self.to_model()).model_name(settings)

    def to_model(self) -> AnyEngineSettings:
        """The settings of the `backend` kind's section."""
        section = getattr(self, self.backend)
        if section is None:
            raise dg.Failure(f"engine backend is {self.backend} but the engine has no {self.backend} config")
        return section.to_model()


EngineConfig = create_model(
    "EngineConfig",
    __base__=EngineConfigBase,
    __doc__="The engine agent turns call: the section of its kind (`llm.kinds`), one per kind.",
    backend=(
        backends(),
        Field(
            default=DEFAULT_KIND,
            description="; ".join(f"{name}: {kind.description}" for name, kind in KINDS.items()) + ".",
        ),
    ),
    **{
        name: (config | None, Field(default=None, description=f"The {name} engine, when backend is {name}."))
        for name, config in KIND_CONFIGS.items()
    },
)
