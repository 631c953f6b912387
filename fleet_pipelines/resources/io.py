"""IO managers over a UPath: a local folder in dev, `s3://…` or `gs://…` in production.

- `DomainIOManager` (`io_manager`): asset values that are domain objects, a pydantic model or a
  list of them, as JSON at `<base_path>/<asset>/<partition>.json` (history/stored.py). The file
  names its model (one of ours) and the run that stored it, so a reader needs no Dagster to load
  it (`fleet result` answers from the stored decision this way); loading checks it against the
  type the reading asset declares.
- `ParquetIOManager` (`frames_io_manager`): tables (the evaluation), as Parquet.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import Field
from upath import UPath

from ..domain.models import safe_partition_key
from ..history.stored import dump_value, load_value


class _DomainUPathIOManager(dg.UPathIOManager):
    extension = ".json"

    def dump_to_path(self, context: dg.OutputContext, obj: Any, path: UPath) -> None:
        try:
            text = dump_value(obj, context.run_id)
        except TypeError as exc:
            raise TypeError(f"{context.asset_key.to_user_string()}: {exc}") from exc
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def load_from_path(self, context: dg.InputContext, path: UPath) -> Any:
        return load_value(path.read_text(), context.dagster_type.typing_type)

    def get_path_for_partition(
        self, context: dg.InputContext | dg.OutputContext, path: UPath, partition: str
    ) -> UPath:
        return super().get_path_for_partition(context, path, safe_partition_key(partition))


class DomainIOManager(dg.ConfigurableIOManagerFactory):
    """Stores each asset partition's domain objects as `<base_path>/<asset>/<partition>.json`."""

    base_path: str = Field(description="Folder or object-store URL (s3://bucket/prefix) for asset values.")

    def create_io_manager(self, context: dg.InitResourceContext) -> _DomainUPathIOManager:
        return _DomainUPathIOManager(base_path=UPath(self.base_path))


class _ParquetUPathIOManager(dg.UPathIOManager):
    extension = ".parquet"

    def dump_to_path(self, context: dg.OutputContext, obj: Any, path: UPath) -> None:
        import pandas as pd

        if not isinstance(obj, pd.DataFrame):
            raise TypeError(f"{context.asset_key.to_user_string()}: expected a DataFrame, got {type(obj)}")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            obj.to_parquet(f, index=False)

    def load_from_path(self, context: dg.InputContext, path: UPath) -> Any:
        import pandas as pd

        with path.open("rb") as f:
            return pd.read_parquet(f)


class ParquetIOManager(dg.ConfigurableIOManagerFactory):
    """Stores each asset partition as `<base_path>/<asset>/<partition>.parquet`."""

    base_path: str = Field(description="Folder or object-store URL (s3://bucket/prefix) for asset values.")

    def create_io_manager(self, context: dg.InitResourceContext) -> _ParquetUPathIOManager:
        return _ParquetUPathIOManager(base_path=UPath(self.base_path))
