"""Dagster assets."""
