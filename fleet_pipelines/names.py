"""Names the parts of the system find each other by: jobs, asset keys, groups, partitions, run tags.

The bottom layer: plain strings, no imports, so the CLI, the events and the history read them
without loading Dagster or the assets.
"""

# Jobs
DELIBERATION_JOB = "deliberation_job"
EVALUATION_JOB = "evaluation_job"
DECISION_LOG_JOB = "decision_log_job"
RETENTION_JOB = "retention_job"
RUN_FAILURE_SENSOR = "deliberation_failure_sensor"
OUTBOX_SENSOR = "event_outbox_sensor"

# Partitions (dynamic: one per task id, one per story id)
DELIBERATION_PARTITIONS = "deliberations"
STORY_PARTITIONS = "stories"

# Asset groups
DELIBERATION_GROUP = "deliberation"
STORY_GROUP = "stories"
EVALUATION_GROUP = "evaluation"
HISTORY_GROUP = "history"

# Assets of a deliberation, in order (each is also the asset's key), and the story's decisions.
DELIBERATION_TASK = "deliberation_task"
COUNCIL = "council"
WORKSPACE = "workspace"
PROPOSALS = "proposals"
SCORES = "scores"
DECISION = "decision"
DECISION_EVENTS = "decision_events"
WINNING_BRANCH = "winning_branch"
STORY_CONTEXT = "story_context"
REVIEWS = "reviews"
# Those whose values a run stores as JSON files (history/stored.py), in the order a run stores them.
DELIBERATION_ASSETS = (
    DELIBERATION_TASK,
    STORY_CONTEXT,
    WORKSPACE,
    COUNCIL,
    PROPOSALS,
    REVIEWS,
    SCORES,
    DECISION,
    WINNING_BRANCH,
)
STORY_DECISIONS = "story_decisions"
DECISION_LOG = "decision_log"

# Run tags
PARTITION_TAG = "dagster/partition"
TAG_ROLE = "fleet/role"  # the run queue limits runs per role
TAG_ENGINE = "fleet/engine"  # the engine of the run: the run queue limits runs per engine
TAG_STORY = "fleet/story_id"
TAG_PLAN = "fleet/plan_id"
TAG_CORRELATION = "fleet/correlation_id"
TAG_CAUSATION = "fleet/causation_id"
TAG_EVENT_SEQ = "fleet/planning_seq"

# Run-log lines of finished turns start with it (`fleet result --follow` prints them).
TURN_LOG_PREFIX = "turn "
