"""Asset values as stored: self-describing JSON at `<base_path>/<asset>/<partition>.json`.

The `io_manager` (resources/io.py) writes them; readers that must start fast (`fleet result`) read
them here, with no Dagster: each file names its model and the run that stored it. The model is
looked up among ours (`STORED_MODELS`); a file never decides what gets imported, and one naming
anything else is refused.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from upath import UPath

from ..domain.context import StoryContext
from ..domain.councils import Convened
from ..domain.decision import Decision
from ..domain.models import Task, TurnResult, safe_partition_key
from ..domain.scoring import ProposalScore
from ..domain.workspace import PushedBranch, Workspace


class StoredValueError(ValueError):
    """A stored file names a model that is not one of ours, or holds another type than expected."""


# Every model an asset stores, by name (the name written in the file).
STORED_MODELS: dict[str, type[BaseModel]] = {
    m.__name__: m
    for m in (Task, StoryContext, Workspace, Convened, TurnResult, ProposalScore, Decision, PushedBranch)
}


def _model_class(name: str) -> type[BaseModel]:
    """The model a file names: a name of `STORED_MODELS`, or (files written before this registry)
    the `module:qualname` path of one of them. Nothing is imported."""
    module, sep, qualname = name.rpartition(":")
    model = STORED_MODELS.get(qualname)
    if model is None or (sep and module != model.__module__):
        raise StoredValueError(f"stored value names {name!r}, which is not one of {', '.join(STORED_MODELS)}")
    return model


def dump_value(value: BaseModel | list[BaseModel], run_id: str | None = None) -> str:
    """A model or a list of models as self-describing JSON, with the run that stored it."""
    many = isinstance(value, list)
    items = value if many else [value]
    if not all(isinstance(i, BaseModel) for i in items):
        raise TypeError(f"expected a pydantic model or a list of them, got {type(value).__name__}")
    model = type(items[0]) if items else TurnResult  # an empty list: its model is not told apart
    if any(type(i) is not model for i in items):
        raise TypeError(f"a stored list holds one model; got {sorted({type(i).__name__ for i in items})}")
    if STORED_MODELS.get(model.__name__) is not model:
        raise TypeError(f"{model.__name__} is not a stored model (history.stored.STORED_MODELS)")
    data = [i.model_dump(mode="json") for i in items]
    return json.dumps(
        {"model": model.__name__, "many": many, "run_id": run_id, "value": data if many else data[0]}
    )


def _parse(stored: dict) -> BaseModel | list[BaseModel]:
    model = _model_class(str(stored.get("model")))
    if stored["many"]:
        return TypeAdapter(list[model]).validate_python(stored["value"])
    return model.model_validate(stored["value"])


def load_value(text: str, expected: Any = None) -> BaseModel | list[BaseModel]:
    """The stored value; with `expected` (an asset's declared type: a model or a list of one),
    refused unless it is of that type."""
    value = _parse(json.loads(text))
    if expected is not None and expected is not Any:
        try:
            TypeAdapter(expected).validate_python(value, strict=True)
        except ValidationError as exc:
            raise StoredValueError(f"stored value is not a {expected}: {exc.errors()[0]['msg']}") from exc
    return value


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


def stored_run_id(base_path: str, asset: str, partition: str) -> str | None:
    """The id of the run that stored an asset partition's value (None: nothing stored, or stored
    before run ids were), without reading the value."""
    try:
        return json.loads(stored_path(base_path, asset, partition).read_text()).get("run_id")
    except FileNotFoundError:
        return None


def frame_path(base_path: str, asset: str, partition: str) -> UPath:
    """Where `ParquetIOManager` keeps a table's partition (UPathIOManager's layout)."""
    return UPath(base_path) / asset / f"{safe_partition_key(partition)}.parquet"


def read_frame(base_path: str, asset: str, partition: str) -> Any:
    """A stored table partition (a DataFrame), or None when there is none."""
    import pandas as pd

    path = frame_path(base_path, asset, partition)
    if not path.exists():
        return None
    with path.open("rb") as f:
        return pd.read_parquet(f)
