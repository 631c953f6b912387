"""The partitions of deliberations (one per task id) and of stories (one per story id)."""

import dagster as dg

from . import DELIBERATION_PARTITIONS

deliberation_partitions = dg.DynamicPartitionsDefinition(name=DELIBERATION_PARTITIONS)
story_partitions = dg.DynamicPartitionsDefinition(name="stories")
GROUP = "deliberation"
STORY_GROUP = "stories"
