"""Dagster assets."""

# Names other parts look deliberations up by, importable without loading the assets.
DELIBERATION_JOB = "deliberation_job"
DELIBERATION_PARTITIONS = "deliberations"
