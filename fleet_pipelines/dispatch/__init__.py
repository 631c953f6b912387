"""Agent turns dispatched to Ray."""
