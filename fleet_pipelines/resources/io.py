"""Parquet IO manager over a UPath: a local folder in dev, `s3://…` or `gs://…` in production."""

from __future__ import annotations

import dagster as dg
import pandas as pd
from pydantic import Field
from upath import UPath


class _ParquetUPathIOManager(dg.UPathIOManager):
    extension = ".parquet"

    def dump_to_path(self, context: dg.OutputContext, obj: pd.DataFrame, path: UPath) -> None:
        if not isinstance(obj, pd.DataFrame):
            raise TypeError(f"{context.asset_key.to_user_string()}: expected a DataFrame, got {type(obj)}")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            obj.to_parquet(f, index=False)

    def load_from_path(self, context: dg.InputContext, path: UPath) -> pd.DataFrame:
        with path.open("rb") as f:
            return pd.read_parquet(f)


class ParquetIOManager(dg.ConfigurableIOManagerFactory):
    """Stores each asset partition as `<base_path>/<asset>/<partition>.parquet`."""

    base_path: str = Field(description="Folder or object-store URL (s3://bucket/prefix) for asset values.")

    def create_io_manager(self, context: dg.InitResourceContext) -> _ParquetUPathIOManager:
        return _ParquetUPathIOManager(base_path=UPath(self.base_path))
