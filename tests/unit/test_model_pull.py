"""`fleet model pull`: the model folder lands whole (every file, relative paths kept) or not at
all, from any fsspec URL (a local folder and fsspec's in-memory filesystem here; s3:// in the
cluster goes through the same calls of s3fs)."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pytest

from fleet_pipelines.cli import main
from fleet_pipelines.llm.model_pull import pull_model

FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b"{}",
    "shards/model-00001.safetensors": os.urandom(4096),
}


def write_local(root: Path) -> None:
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("scheme", ["path", "file", "memory"])
def test_pull_copies_every_file_with_its_relative_path(tmp_path: Path, scheme: str):
    if scheme == "memory":
        fs = fsspec.filesystem("memory")
        for name, data in FILES.items():
            fs.pipe(f"/models-{tmp_path.name}/served/{name}", data)
        source = f"memory://models-{tmp_path.name}/served/"
    else:
        write_local(tmp_path / "bucket")
        source = str(tmp_path / "bucket") if scheme == "path" else f"file://{tmp_path / 'bucket'}"
    pulled = pull_model(source, tmp_path / "models" / "served")
    assert pulled.copied and pulled.files == len(FILES)
    assert pulled.bytes == sum(len(d) for d in FILES.values())
    assert read_tree(tmp_path / "models" / "served") == FILES
    assert not (tmp_path / "models" / "served.partial").exists()


def test_a_folder_already_there_is_kept(tmp_path: Path):
    write_local(tmp_path / "bucket")
    pull_model(str(tmp_path / "bucket"), tmp_path / "served")
    (tmp_path / "bucket" / "config.json").write_text("changed")
    again = pull_model(str(tmp_path / "bucket"), tmp_path / "served")
    assert not again.copied and again.files == len(FILES)
    assert read_tree(tmp_path / "served") == FILES


def test_a_failed_copy_leaves_no_model_and_the_next_try_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    write_local(tmp_path / "bucket")
    fs_class = type(fsspec.filesystem("file"))
    real_get_file = fs_class.get_file
    calls = []

    def failing_get_file(self, remote, local, **kwargs):
        calls.append(remote)
        if len(calls) == 2:
            raise ConnectionError("network gone")
        return real_get_file(self, remote, local, **kwargs)

    monkeypatch.setattr(fs_class, "get_file", failing_get_file)
    with pytest.raises(ConnectionError):
        pull_model(str(tmp_path / "bucket"), tmp_path / "served")
    assert not (tmp_path / "served").exists()
    monkeypatch.setattr(fs_class, "get_file", real_get_file)
    assert pull_model(str(tmp_path / "bucket"), tmp_path / "served").copied
    assert read_tree(tmp_path / "served") == FILES


def test_an_empty_source_is_an_error(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no files"):
        pull_model(str(tmp_path / "empty"), tmp_path / "served")
    assert not (tmp_path / "served").exists()


def test_the_cli_reads_source_and_destination_from_the_pod_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    write_local(tmp_path / "bucket")
    monkeypatch.setenv("FLEET_MODEL_SOURCE", str(tmp_path / "bucket"))
    monkeypatch.setenv("FLEET_VLLM_MODEL", str(tmp_path / "models" / "served"))
    assert main(["model", "pull"]) == 0
    assert "copied 3 files" in capsys.readouterr().out
    assert read_tree(tmp_path / "models" / "served") == FILES
    monkeypatch.delenv("FLEET_MODEL_SOURCE")
    assert main(["model", "pull"]) == 2
