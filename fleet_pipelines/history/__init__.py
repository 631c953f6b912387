"""A year of deliberations: the daily decision log, retention of old partitions, lookups by index."""
