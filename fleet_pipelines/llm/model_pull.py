"""Copies a model folder (the Hugging Face layout vLLM loads: config, weights, tokenizer) from
object storage onto local disk.

In the cluster the model reaches vLLM this way: the folder is uploaded once to object storage
(`FLEET_MODEL_SOURCE`, e.g. `s3://bucket/models/served`), and an init container of every pod that
runs vLLM (deploy/k8s: the vLLM Deployment, the Ray GPU workers) runs `fleet model pull`, which
copies it onto the pod's own scratch volume at `FLEET_VLLM_MODEL`. No shared volume is needed, so
any cluster works. Any fsspec URL is accepted (`s3://` through s3fs, a local path in tests).

The folder lands whole or not at all: files are copied into a sibling `.partial` folder that is
renamed into place at the end, so vLLM never loads half a model and a restarted init container
starts over cleanly.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import fsspec


@dataclass(frozen=True)
class PulledModel:
    path: Path
    files: int
    bytes: int
    copied: bool  # False: the folder was already there


def pull_model(source: str, dest: Path) -> PulledModel:
    """Copies every file under `source` to `dest`, keeping relative paths."""
    if dest.is_dir():
        files = [p for p in dest.rglob("*") if p.is_file()]
        return PulledModel(dest, len(files), sum(p.stat().st_size for p in files), copied=False)
    fs, root = fsspec.core.url_to_fs(source)
    root = root.rstrip("/")
    found = sorted(fs.find(root))
    if not found:
        raise FileNotFoundError(f"no files under {source}")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    total = 0
    for remote in found:
        relative = remote[len(root) :].lstrip("/")
        target = partial / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(remote, str(target))
        total += target.stat().st_size
    partial.rename(dest)
    return PulledModel(dest, len(found), total, copied=True)
