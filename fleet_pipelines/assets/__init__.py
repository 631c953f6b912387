"""Dagster assets."""

# Names other parts look deliberations up by, importable without loading the assets.
DELIBERATION_JOB = "deliberation_job"
DELIBERATION_PARTITIONS = "deliberations"
TURN_LOG_PREFIX = "turn "  # run-log lines of finished turns start with it (`fleet result --follow`)
