"""`decision_log`: every deliberation's outcome, one table per UTC day (see history/log.py)."""

import dagster as dg

from ..history.log import build_day
from ..names import DECISION_LOG, DECISION_LOG_JOB, HISTORY_GROUP
from ..resources.history import HistoryResource

decision_log_partitions = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_offset=1)


# No `deps` on `decision`: a mapping from days to dynamic partitions would make the UI relate every
# day to every deliberation partition, the count this asset exists to keep small.
@dg.asset(
    name=DECISION_LOG,
    partitions_def=decision_log_partitions,
    group_name=HISTORY_GROUP,
    kinds={"pandas", "parquet"},
    io_manager_key="frames_io_manager",
)
def decision_log(context: dg.AssetExecutionContext, history: HistoryResource) -> dg.Output:
    """The deliberations decided on this day (UTC): task, story, plan, role, status, winner, scores,
    tokens, timings, run id and the winning proposal; one row per decision. Today's partition is
    rebuilt every hour; retention removes a deliberation only once it is in this table. A pandas
    DataFrame (imported when the table is built, not with the code location)."""
    frame = build_day(context.instance, history.base_path, context.partition_key)
    return dg.Output(
        frame,
        metadata={
            "dagster/row_count": len(frame),
            "statuses": dg.MetadataValue.json(
                {str(k): int(v) for k, v in frame["status"].value_counts().items()}
            ),
            "tokens_out": int(frame["tokens_out"].sum()),
        },
    )


decision_log_job = dg.define_asset_job(
    DECISION_LOG_JOB,
    selection=[decision_log],
    partitions_def=decision_log_partitions,
    executor_def=dg.in_process_executor,
    description="Builds one day of the decision log.",
)
