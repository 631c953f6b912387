"""Deadlines and statuses against the real stack: an engine stopped mid-run, a deadline too short."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from fleet_pipelines import stack, wiring
from fleet_pipelines.assets.deliberation import (
    materialize_deliberation,
)
from fleet_pipelines.domain.models import DeliberationStatus, TurnStatus
from fleet_pipelines.settings import FleetSettings

TASK_CONFIG = {
    "description": "Write a Python function add(a, b) that returns the sum of two numbers.",
    "role": "DEV",
    "num_agents": 3,
    "rubric": "Correct.",
    "requirements": ["return the sum"],
}


def test_engine_stopped_after_the_proposals_gives_partial_within_the_deadline(
    ray_head, dagster_instance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Our own llama.cpp server (not the shared one), stopped once the proposals are stored: the
    review turns fail, the proposals are kept, the decision is PARTIAL with a winner."""
    port = stack.free_port()
    server = stack.start_model_server(tmp_path / "logs", port, parallel=3)
    try:
        monkeypatch.setenv("FLEET_LLM_BASE_URL", f"http://127.0.0.1:{port}/v1")
        monkeypatch.setenv("FLEET_STORAGE_PATH", str(tmp_path / "storage"))
        monkeypatch.setenv("FLEET_MAX_TOKENS", "64")
        resources = wiring.resources(FleetSettings.from_env())
        task_id = "deadline-engine-stopped"
        deadline_s = 120.0
        outcome: dict = {}

        def deliberate() -> None:
            outcome["result"] = materialize_deliberation(
                dagster_instance,
                resources,
                task_id,
                {**TASK_CONFIG, "rounds": 1, "timeout_seconds": deadline_s},
                raise_on_error=False,
            )

        started = time.monotonic()
        runner = threading.Thread(target=deliberate)
        runner.start()
        while dagster_instance.get_latest_materialization_event(dg.AssetKey("proposals")) is None:
            assert runner.is_alive(), "the run ended before its proposals were stored"
            time.sleep(0.2)
        server.stop()
        runner.join(deadline_s + 30)
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    assert not runner.is_alive()
    result = outcome["result"]
    assert elapsed < deadline_s + 10
    reviews = result.output_for_node("reviews")
    assert reviews and all(r.status is TurnStatus.FAILED and r.error_type for r in reviews)
    decision = result.output_for_node("decision")
    assert decision.status is DeliberationStatus.PARTIAL
    assert decision.winner_id in {"agent-dev-001", "agent-dev-002", "agent-dev-003"}
    assert any("quorum met" in reason for reason in decision.reasons)
    judge = [
        s
        for s in result.output_for_node("scores")
        if "not scored: judge turn failed" in s.check("judge").evidence
    ]
    assert len(judge) == 3  # the judge could not run either, and says so
    quorum = next(e for e in result.get_asset_check_evaluations() if e.check_name == "quorum_met")
    assert quorum.passed


def test_a_deadline_hit_before_quorum_is_timeout_and_the_blocking_check_fails(
    stack_env, dagster_instance, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FLEET_MAX_TOKENS", "512")
    resources = wiring.resources(FleetSettings.from_env())
    task_id = "deadline-too-short"
    result = materialize_deliberation(
        dagster_instance,
        resources,
        task_id,
        {**TASK_CONFIG, "rounds": 1, "timeout_seconds": 1.0},
        raise_on_error=False,
    )
    proposals = result.output_for_node("proposals")
    assert any(p.status is TurnStatus.TIMEOUT for p in proposals)
    decision = result.output_for_node("decision")
    assert decision.status is DeliberationStatus.TIMEOUT and decision.winner_id is None
    quorum = next(e for e in result.get_asset_check_evaluations() if e.check_name == "quorum_met")
    assert not quorum.passed and quorum.severity == dg.AssetCheckSeverity.ERROR
    assert not result.success  # the blocking check fails the run: it shows red in the UI
