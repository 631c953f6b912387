"""Pure deliberation logic: no Dagster, Ray, NATS or HTTP client imports here."""
