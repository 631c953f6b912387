"""The integration tier: every test runs with the session's real nats-server (NATS_URL points at
it), so every run that publishes events, and every `fleet` subprocess, uses it, never :4222.

The tier runs on two workers (`make test`: pytest-xdist, one test handed out at a time), each with
its own servers. The longest tests (marked `heavy`) go first, longest first, so that no worker is
left running one alone at the end.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def seconds(item: pytest.Item) -> float:
        marker = item.get_closest_marker("heavy")
        return marker.args[0] if marker is not None else 0.0

    items.sort(key=seconds, reverse=True)  # stable: the others keep their order


@pytest.fixture(scope="session", autouse=True)
def session_nats(nats_server: str) -> str:
    return nats_server
