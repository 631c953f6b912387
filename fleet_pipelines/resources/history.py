"""Where the decision log and retention find stored values, and the retention age."""

from __future__ import annotations

import dagster as dg
from pydantic import Field


class HistoryResource(dg.ConfigurableResource):
    """The storage the IO managers write to, read and pruned by the decision log and retention."""

    base_path: str = Field(description="The IO managers' base path (FLEET_STORAGE_PATH).")
    max_age_seconds: float = Field(
        gt=0,
        description="Decided deliberations older than this leave the partition set once they are in "
        "the decision log (FLEET_RETENTION_SECONDS, alias DELIBERATION_CLEANUP).",
    )
