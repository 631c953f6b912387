"""The integration tier: every test runs with the session's real nats-server (NATS_URL points at
it), so every run that publishes events, and every `fleet` subprocess, uses it, never :4222."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def session_nats(nats_server: str) -> str:
    return nats_server
