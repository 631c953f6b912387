"""Dagster resources wiring the adapters (LLM engine, Ray dispatch, storage)."""
