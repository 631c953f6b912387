"""`fleet result` for a task that has not decided, from the instance's tables without Dagster
(history/run_index.py), held to a real Dagster instance's own answers: SQLite as `make dev` keeps
it, and PostgreSQL as deployed (deploy/dagster/dagster.yaml's storage block; skipped, saying why,
when no server answers). Runs are added in every status the lookup tells apart, through Dagster's
own API; then the index must name the same latest run, status and partition as
`get_run_records`/`has_dynamic_partition`, and the quick answer must be the full lookup's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

from fleet_pipelines.cli import REPO_ROOT
from fleet_pipelines.domain.models import Role, Task
from fleet_pipelines.history.run_index import RunIndexError, open_run_index
from fleet_pipelines.history.status import task_result, undecided_result
from fleet_pipelines.history.stored import dump_value, stored_path
from fleet_pipelines.names import (
    DECISION,
    DELIBERATION_JOB,
    DELIBERATION_PARTITIONS,
    DELIBERATION_TASK,
    PARTITION_TAG,
)
from tests.integration.test_postgres_storage import postgres_db, postgres_home  # noqa: F401 (fixtures)

S = dg.DagsterRunStatus
# task -> the statuses of its runs, oldest first (the last one is the task's latest run)
RUNS: dict[str, list[dg.DagsterRunStatus]] = {
    "t-queued": [S.QUEUED],
    "t-not-started": [S.NOT_STARTED],
    "t-starting": [S.STARTING],
    "t-running": [S.STARTED],
    "t-retried": [S.FAILURE, S.SUCCESS, S.QUEUED],  # the newest run answers, not the oldest
    "t-deciding": [S.STARTED],  # it stored its decision; the run has not ended
    "t-failed": [S.FAILURE],
    "t-succeeded": [S.SUCCESS],
    "t-canceling": [S.CANCELING],
}
# Where a queued run would be launched from (a code location by name; nothing loads it here).
ORIGIN = RemoteJobOrigin(
    RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("fleet_pipelines"), "__repository__"),
    DELIBERATION_JOB,
)
E = dg.DagsterEventType
STATUS_EVENT = {
    S.QUEUED: E.RUN_ENQUEUED,
    S.STARTING: E.RUN_STARTING,
    S.STARTED: E.RUN_START,
    S.SUCCESS: E.RUN_SUCCESS,
    S.FAILURE: E.RUN_FAILURE,
    S.CANCELING: E.RUN_CANCELING,
}
PARTITIONS = [*RUNS, "t-partition-only"]
# What the quick lookup answers (None: it leaves the task to Dagster)
QUICK = {
    "t-queued": "PENDING",
    "t-not-started": "PENDING",
    "t-starting": "PENDING",
    "t-running": "IN_PROGRESS",
    "t-retried": "PENDING",
    "t-deciding": None,
    "t-failed": None,
    "t-succeeded": None,
    "t-canceling": None,
    "t-partition-only": "PENDING",
    "t-unknown": "NOT_FOUND",
}


def _store(storage: str, asset: str, task_id: str, run_id: str) -> None:
    task = Task(task_id=task_id, description="Write add(a, b).", role=Role.DEV, num_agents=2)
    path = stored_path(storage, asset, task_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_value(task, run_id))  # only the run id is read by the quick lookup


def fill(instance: dg.DagsterInstance, storage: str) -> dict[str, str]:
    """The runs and partitions of RUNS/PARTITIONS; returns each task's latest run id."""
    instance.add_dynamic_partitions(DELIBERATION_PARTITIONS, PARTITIONS)
    latest = {}
    for task_id, statuses in RUNS.items():
        for i, status in enumerate(statuses):
            run = instance.add_run(
                dg.DagsterRun(
                    job_name=DELIBERATION_JOB,
                    run_id=f"{task_id}-run-{i}",
                    tags={PARTITION_TAG: task_id},
                    remote_job_origin=ORIGIN,  # Dagster requires one of a queued run
                )
            )
            if status is not S.NOT_STARTED:  # how Dagster moves a run: the run event of its status
                event = dg.DagsterEvent(
                    event_type_value=STATUS_EVENT[status].value, job_name=DELIBERATION_JOB
                )
                instance.report_dagster_event(event, run.run_id)
            assert instance.get_run_by_id(run.run_id).status is status
            latest[task_id] = run.run_id
    # Another job's run tagged with the same partition is not a deliberation run.
    instance.add_run(dg.DagsterRun(job_name="other_job", run_id="other-1", tags={PARTITION_TAG: "t-unknown"}))
    _store(storage, DELIBERATION_TASK, "t-running", latest["t-running"])
    _store(storage, DELIBERATION_TASK, "t-deciding", latest["t-deciding"])
    _store(storage, DECISION, "t-deciding", latest["t-deciding"])
    return latest


def check_against_dagster(home: Path, storage: str) -> None:
    instance = dg.DagsterInstance.from_config(str(home))
    latest = fill(instance, storage)
    index = open_run_index(home)
    assert index is not None
    for task_id in QUICK:
        records = instance.get_run_records(
            dg.RunsFilter(job_name=DELIBERATION_JOB, tags={PARTITION_TAG: task_id}), limit=1
        )
        run = index.latest_run(task_id)
        if records:
            assert run is not None and run.run_id == latest[task_id] == records[0].dagster_run.run_id
            assert run.status == records[0].dagster_run.status.value
        else:
            assert run is None
        assert index.has_partition(task_id) == instance.has_dynamic_partition(
            DELIBERATION_PARTITIONS, task_id
        )

        quick = undecided_result(
            storage,
            task_id,
            (run.run_id, run.status) if run else None,
            index.has_partition(task_id),
            lambda _task_id: None,
        )
        assert (quick.status.value if quick else None) == QUICK[task_id], task_id
        if quick is not None:  # the full lookup answers the same
            full = task_result(instance, storage, task_id, lambda _task_id: None)
            assert full == quick
    running = undecided_result(storage, "t-running", (latest["t-running"], "STARTED"), True, lambda _: None)
    assert running is not None and running.detail.endswith("stored: deliberation_task")


def test_the_quick_lookup_agrees_with_dagster_on_sqlite(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    check_against_dagster(home, str(tmp_path / "storage"))


def test_the_quick_lookup_agrees_with_dagster_on_postgres(postgres_home: Path, tmp_path: Path):  # noqa: F811
    check_against_dagster(postgres_home, str(tmp_path / "storage"))


def test_storages_the_quick_lookup_does_not_read_are_left_to_dagster(tmp_path: Path, monkeypatch):
    cases = {
        "run_storage:\n  module: some.module\n  class: Custom\n": None,
        "storage:\n  mysql:\n    mysql_url: mysql://x\n": None,
        "storage:\n  sqlite:\n    base_dir: /elsewhere\n": "sqlite",
        "storage:\n  postgres:\n    postgres_url: postgresql+psycopg2://u@127.0.0.1:1/db\n": "postgres",
    }
    for config, read in cases.items():
        (tmp_path / "dagster.yaml").write_text(config)
        assert (open_run_index(tmp_path) is not None) == (read is not None), config
    # A database that does not answer, or an environment variable not set: RunIndexError, then Dagster.
    (tmp_path / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_url: postgresql://u@127.0.0.1:1/db\n"
    )
    index = open_run_index(tmp_path)
    with pytest.raises(RunIndexError, match="PostgreSQL"):
        index.latest_run("t")
    (tmp_path / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_url:\n      env: FLEET_TEST_UNSET_URL\n"
    )
    monkeypatch.delenv("FLEET_TEST_UNSET_URL", raising=False)
    with pytest.raises(RunIndexError, match="FLEET_TEST_UNSET_URL"):
        open_run_index(tmp_path)
    # A SQLite table that does not read as expected (a Dagster upgrade changed it).
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    (tmp_path / "history" / "runs").mkdir(parents=True)
    import sqlite3

    sqlite3.connect(tmp_path / "history" / "runs.db").execute(
        "CREATE TABLE runs (id INTEGER)"
    ).connection.commit()
    with pytest.raises(RunIndexError, match="no such"):
        open_run_index(tmp_path).latest_run("t")


WHICH = (
    "import sys\nfrom fleet_pipelines.cli import fleet\n"
    "try:\n    fleet(['result', sys.argv[1], '--json'])\n"
    "except SystemExit as exit:\n"
    "    print('dagster' in sys.modules, exit.code, file=sys.stderr)\n"
)


def test_fleet_result_answers_tasks_not_decided_without_loading_dagster(tmp_path: Path):
    """Each answer in a fresh process, as a user runs it: unknown, pending (queued run, partition
    only), running, and decided by a run that failed (only Dagster knows why: it is loaded)."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    storage = str(tmp_path / "storage")
    latest = fill(dg.DagsterInstance.from_config(str(home)), storage)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "FLEET_STORAGE_PATH": storage,
        "NATS_URL": "nats://127.0.0.1:1",
    }
    expected = {
        "t-unknown": ("NOT_FOUND", None, "3", False),
        "t-queued": ("PENDING", latest["t-queued"], "0", False),
        "t-partition-only": ("PENDING", None, "0", False),
        "t-running": ("IN_PROGRESS", latest["t-running"], "0", False),
        "t-failed": ("FAILED", latest["t-failed"], "1", True),
    }
    for task_id, (status, run_id, code, dagster_loaded) in expected.items():
        shown = subprocess.run(
            [sys.executable, "-c", WHICH, task_id], env=env, capture_output=True, text=True, timeout=120
        )
        answer = json.loads(shown.stdout)
        assert (answer["status"], answer["run_id"]) == (status, run_id), shown.stdout
        assert shown.stderr.split()[-2:] == [str(dagster_loaded), code], shown.stderr[-2000:]


def test_the_stored_assets_the_quick_lookup_lists_are_the_deliberations():
    """Every asset of a deliberation stores its value as JSON (history/stored.py) except
    decision_events, which publishes; `IN_PROGRESS` lists them in this order."""
    from fleet_pipelines.assets.deliberation import deliberation_assets
    from fleet_pipelines.names import DECISION_EVENTS, DELIBERATION_ASSETS

    keys = [k.to_user_string() for a in deliberation_assets for k in a.keys]
    assert tuple(k for k in keys if k != DECISION_EVENTS) == DELIBERATION_ASSETS
