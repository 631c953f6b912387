"""The partitions of deliberations (one per task id) and of stories (one per story id)."""

import dagster as dg

from ..names import DELIBERATION_PARTITIONS, STORY_PARTITIONS

deliberation_partitions = dg.DynamicPartitionsDefinition(name=DELIBERATION_PARTITIONS)
story_partitions = dg.DynamicPartitionsDefinition(name=STORY_PARTITIONS)
