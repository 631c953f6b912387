"""fleet_pipelines: multi-agent LLM deliberation as a Dagster code location."""
