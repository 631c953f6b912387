"""Asset values as stored: self-describing JSON at `<base_path>/<asset>/<partition>.json`.

The `io_manager` (resources/io.py) writes them; readers that must start fast (`fleet result`) read
them here, with no Dagster: each file names its pydantic model and the run that stored it.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from pydantic import BaseModel, TypeAdapter
from upath import UPath

from ..domain.models import safe_partition_key


def _model_name(model: type[BaseModel]) -> str:
    return f"{model.__module__}:{model.__qualname__}"


def _model_class(name: str) -> type[BaseModel]:
    module, _, qualname = name.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def dump_value(value: BaseModel | list[BaseModel], run_id: str | None = None) -> str:
    """A model or a list of models as self-describing JSON, with the run that stored it."""
    many = isinstance(value, list)
    items = value if many else [value]
    if not all(isinstance(i, BaseModel) for i in items):
        raise TypeError(f"expected a pydantic model or a list of them, got {type(value).__name__}")
    model = type(items[0]) if items else BaseModel
    if any(type(i) is not model for i in items):
        raise TypeError(f"a stored list holds one model; got {sorted({type(i).__name__ for i in items})}")
    data = [i.model_dump(mode="json") for i in items]
    return json.dumps(
        {"model": _model_name(model), "many": many, "run_id": run_id, "value": data if many else data[0]}
    )


def _parse(stored: dict) -> BaseModel | list[BaseModel]:
    model = _model_class(stored["model"])
    if stored["many"]:
        return TypeAdapter(list[model]).validate_python(stored["value"])
    return model.model_validate(stored["value"])


def load_value(text: str) -> BaseModel | list[BaseModel]:
    return _parse(json.loads(text))


def stored_path(base_path: str, asset: str, partition: str) -> UPath:
    return UPath(base_path) / asset / f"{safe_partition_key(partition)}.json"


def read_stored(base_path: str, asset: str, partition: str) -> BaseModel | list[BaseModel]:
    """An asset partition's value straight from storage, without the code location."""
    return load_value(stored_path(base_path, asset, partition).read_text())


def read_stored_entry(
    base_path: str, asset: str, partition: str
) -> tuple[BaseModel | list[BaseModel], str | None] | None:
    """(value, id of the run that stored it) of an asset partition; None when nothing is stored.
    Files written before run ids were stored give None for the run."""
    path = stored_path(base_path, asset, partition)
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return _parse(stored), stored.get("run_id")
