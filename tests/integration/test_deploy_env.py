"""A Ray worker's process calls the engine with the key it was sent, never from a Secret of its
own (the rest of the deployment's environment: tests/unit/test_deploy_env.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.unit.deploy_objects import K8S, containers, load_docs, workload_pods
from tests.unit.test_deploy_env import secret_refs


def test_ray_workers_get_the_key_with_the_turns():
    """The process on a Ray worker that calls the engine (the admission queue actor, make_engine ->
    ChatEngine) takes the key from the EngineSettings it was sent, pickled as Ray pickles actor
    arguments: a process with neither FLEET_LLM_API_KEY nor its _FILE calls with it. So no Ray
    worker holds the fleet-llm Secret."""
    import ray.cloudpickle
    from pydantic import SecretStr

    from fleet_pipelines.llm.settings import EngineSettings

    sent = EngineSettings(base_url="http://fleet-engine:8000/v1", model="m", api_key=SecretStr("k-1"))
    worker = (
        "import sys, ray.cloudpickle\n"
        "from fleet_pipelines.dispatch.admission import make_engine\n"
        "settings = ray.cloudpickle.loads(sys.stdin.buffer.read())\n"
        "print(make_engine(settings)._client.api_key)\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_LLM_API_KEY")}
    done = subprocess.run(
        [sys.executable, "-c", worker],
        input=ray.cloudpickle.dumps(sent),
        capture_output=True,
        env=environ,
        check=True,
    )
    assert done.stdout.decode().strip() == "k-1"
    for owner, pod in workload_pods(load_docs(K8S)):
        if owner.startswith("RayCluster/"):
            for container in containers(pod):
                assert "fleet-llm" not in secret_refs(pod, container), (owner, container["name"])
