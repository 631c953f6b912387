"""The fleet's metrics in Prometheus's conventions, and where each is recorded.

- The engines' admission queues record their own (`dispatch.queue_metrics`, through Ray's
  metrics API, served by the Ray node's metrics agent); the engines serve theirs (llama.cpp's and
  vLLM's `/metrics`).
- Everything about deliberations and events comes from durable sources, read by one long-lived
  exporter (`exporter.FleetExporter`, `fleet metrics serve`): the outcome and dead-letter events
  on NATS (a durable consumer), Dagster's run storage (runs queued and in flight, the runs the
  planning sensor started, its cursor) and the outbox folder. Never from a run's process, which
  ends with its run.
"""
