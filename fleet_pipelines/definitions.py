"""The one Definitions object of the fleet_pipelines code location."""

from __future__ import annotations

import os

import dagster as dg
from dagster_ray import LocalRay

from . import settings
from .assets.deliberation import GROUP, deliberation_assets, deliberation_partitions
from .assets.evaluation import evaluation, evaluation_job
from .resources.council import CouncilResource, LLMEngineResource, VLLMActorConfig
from .resources.events import NatsResource
from .resources.io import ParquetIOManager
from .schedules.evaluation import build_nightly_evaluation
from .sensors import build_event_sensors

deliberation_job = dg.define_asset_job(
    "deliberation_job",
    selection=dg.AssetSelection.groups(GROUP),
    partitions_def=deliberation_partitions,
    executor_def=dg.in_process_executor,  # ~0.1 s per step vs ~1 s per step with a process per step
    description="One council deliberation: proposals, review rounds, scores and the decision.",
)


def _vllm_actor_config() -> VLLMActorConfig | None:
    """The vLLM engine actor (FLEET_ENGINE_BACKEND=vllm_actor) from FLEET_VLLM_* variables."""
    model = os.environ.get("FLEET_VLLM_MODEL")
    if not model:
        return None
    kv_cache = os.environ.get("FLEET_VLLM_CPU_KVCACHE_GIB")
    return VLLMActorConfig(
        model=model,
        served_model_name=settings.llm_model(),
        num_gpus=float(settings.env("FLEET_VLLM_NUM_GPUS", default="1")),
        num_cpus=float(settings.env("FLEET_VLLM_NUM_CPUS", default="1")),
        dtype=settings.env("FLEET_VLLM_DTYPE", default="auto"),
        enforce_eager=settings.env("FLEET_VLLM_ENFORCE_EAGER", default="0") == "1",
        cpu_kvcache_space_gib=int(kv_cache) if kv_cache else None,
        cache_root=os.environ.get("FLEET_VLLM_CACHE_ROOT"),
    )


def build_resources() -> dict[str, object]:
    api_key = dg.EnvVar("FLEET_LLM_API_KEY") if os.environ.get("FLEET_LLM_API_KEY") else None
    llm = LLMEngineResource(base_url=settings.llm_base_url(), model=settings.llm_model(), api_key=api_key)
    return {
        "council": CouncilResource(
            llm=llm,
            max_tokens=settings.max_tokens(),
            engine_backend=settings.env("FLEET_ENGINE_BACKEND", default="openai"),
            vllm_actor=_vllm_actor_config(),
        ),
        # ray.init(address=None) joins the cluster named by RAY_ADDRESS (`make dev` starts a local
        # head and sets it; KubeRay in production); without it Ray starts a private local instance.
        "ray_cluster": LocalRay(ray_init_options={"ignore_reinit_error": True, "log_to_driver": False}),
        "io_manager": ParquetIOManager(base_path=settings.storage_path()),
        # NATS_URL (+ NATS_TOKEN/USER/PASSWORD/CREDS/TLS_*): `make dev` starts one and sets it.
        "nats": NatsResource.from_env(),
    }


defs = dg.Definitions(
    assets=[*deliberation_assets, evaluation],
    jobs=[deliberation_job, evaluation_job],
    schedules=[build_nightly_evaluation()],
    sensors=build_event_sensors(deliberation_job),
    resources=build_resources(),
)
