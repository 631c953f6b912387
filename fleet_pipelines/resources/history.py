"""Where the decision log and retention find stored values, and the retention age (the field of
`history.options.RetentionOptions`)."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from ..history.options import RetentionOptions
from ..workspace.prepare import remove_task_workspaces, workspaces_root
from .config import derived_model

_RetentionFields = derived_model(RetentionOptions, "HistoryRetentionFields", dg.ConfigurableResource)


class HistoryResource(_RetentionFields):
    """The storage the IO managers write to, read and pruned by the decision log and retention."""

    base_path: str = Field(description="The IO managers' base path (FLEET_STORAGE_PATH).")
    workspaces_dir: str = Field(
        default="",
        description="Repository tasks' workspaces (FLEET_WORKSPACES_DIR; default `<tmp>/fleet-workspaces`): "
        "an expired task's are removed with it.",
    )

    def remove_workspace(self, task_id: str) -> bool:
        """Deletes an expired task's workspaces (False: it had none)."""
        return remove_task_workspaces(workspaces_root(self.workspaces_dir), task_id)
