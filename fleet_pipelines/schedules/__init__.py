"""Schedules of the code location."""
