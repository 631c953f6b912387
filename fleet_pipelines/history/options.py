"""How long decided deliberations are kept: a plain value (pydantic only), read by the settings and
the `history` resource (its field is this one)."""

from __future__ import annotations

from pydantic import BaseModel, Field

DEFAULT_RETENTION_SECONDS = 14 * 24 * 3600


class RetentionOptions(BaseModel):
    """The retention age."""

    max_age_seconds: float = Field(
        default=DEFAULT_RETENTION_SECONDS,
        gt=0,
        description="Decided deliberations older than this leave the partition set once they are in "
        "the decision log (FLEET_RETENTION_SECONDS, alias DELIBERATION_CLEANUP).",
    )
