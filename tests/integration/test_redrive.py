"""Re-driving a rejected planning message (issue 7 recovery): list dead letters, refuse a re-drive
that would fail again, publish a corrected message once, and the sensor starts its run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fleet_pipelines.events.models import EventEnvelope
from fleet_pipelines.events.streams import PLANNING_REJECTED
from fleet_pipelines.resources.events import NatsResource
from tests.factories import plan
from tests.integration.test_sensor_planning import publish_raw, tick

BAD = plan("US-9", "P-9", roles=["CHEF"], approved_at="2026-11-25")


def fleet(nats: NatsResource, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleet_pipelines.cli", "nats", *args],
        env={**os.environ, "NATS_URL": nats.url},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_rejected_message_is_listed_and_redriven_once_fixed(dagster_instance, nats_resource, tmp_path: Path):
    seq = publish_raw(nats_resource, json.dumps(BAD).encode())
    requests, cursor, _, _ = tick(dagster_instance, nats_resource, None)
    assert requests == []

    listed = fleet(nats_resource, "rejected")
    assert listed.returncode == 0
    assert f"seq {seq}: " in listed.stdout and "roles.0" in listed.stdout and "CHEF" in listed.stdout

    again = fleet(nats_resource, "redrive", str(seq))  # unchanged, it would only be rejected again
    assert again.returncode == 2 and "CHEF" in again.stderr
    missing = fleet(nats_resource, "redrive", "999")
    assert missing.returncode == 2 and "no rejected" in missing.stderr

    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps({**BAD, "roles": ["DEV"]}))
    for _ in range(2):  # re-driving the same fix twice stores it once
        done = fleet(nats_resource, "redrive", str(seq), "--file", str(fixed))
        assert done.returncode == 0, done.stderr
    requests, cursor, _, _ = tick(dagster_instance, nats_resource, cursor)
    assert [r.tags["fleet/plan_id"] for r in requests] == ["P-9"]
    assert tick(dagster_instance, nats_resource, cursor)[0] == []


def test_a_truncated_original_needs_a_corrected_file_and_old_dead_letters_still_list(
    dagster_instance, nats_resource
):
    big = b'{"story_id": "' + b"x" * 100_000  # not JSON, and over the 64 KiB a dead letter keeps
    seq = publish_raw(nats_resource, big)
    tick(dagster_instance, nats_resource, None)
    refused = fleet(nats_resource, "redrive", str(seq))
    assert refused.returncode == 2 and "keeps only part of the original (100014 bytes" in refused.stderr

    # A dead letter written before dead letters were bounded (no size, hash or truncation flag).
    old = {"stream": "PLANNING_EVENTS", "stream_sequence": 77, "subject": "planning.plan.approved"}
    envelope = EventEnvelope(
        event_type=PLANNING_REJECTED,
        idempotency_key="planning.rejected:PLANNING_EVENTS:77",
        correlation_id="c",
        payload={**old, "reason": "old reason", "original_text": "{}", "original_headers": {}},
    )
    nats_resource.publish([(PLANNING_REJECTED, envelope)])
    listed = fleet(nats_resource, "rejected")
    assert listed.returncode == 0 and "seq 77: old reason" in listed.stdout
