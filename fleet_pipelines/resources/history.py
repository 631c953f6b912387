"""Where the decision log and retention find stored values, and the retention age."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from ..workspace.prepare import remove_task_workspaces, workspaces_root


class HistoryResource(dg.ConfigurableResource):
    """The storage the IO managers write to, read and pruned by the decision log and retention."""

    base_path: str = Field(description="The IO managers' base path (FLEET_STORAGE_PATH).")
    max_age_seconds: float = Field(
        gt=0,
        description="Decided deliberations older than this leave the partition set once they are in "
        "the decision log (FLEET_RETENTION_SECONDS, alias DELIBERATION_CLEANUP).",
    )
    workspaces_dir: str = Field(
        default="",
        description="Repository tasks' workspaces (FLEET_WORKSPACES_DIR; default `<tmp>/fleet-workspaces`): "
        "an expired task's are removed with it.",
    )

    def remove_workspace(self, task_id: str) -> bool:
        """Deletes an expired task's workspaces (False: it had none)."""
        return remove_task_workspaces(workspaces_root(self.workspaces_dir), task_id)
