"""A deliberation on the production storage: the `storage` block of deploy/dagster/dagster.yaml
(dagster-postgres), pointed through its environment variables at a real PostgreSQL server
(127.0.0.1:5432, or FLEET_TEST_PG_HOST/PORT/USER), in a database created for this test run and
dropped after it; and the storage the Dagster chart renders from deploy/helm/dagster-values.yaml,
loaded with this environment's packages (the image's: `make install`). Skipped, with the reason
shown, when no server answers."""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
import yaml

from fleet_pipelines.assets.deliberation import (
    deliberation_partitions,
    materialize_deliberation,
)
from tests.unit.deploy_objects import VALUES, chart_storage

ROOT = Path(__file__).resolve().parents[2]
PG = {
    "host": os.environ.get("FLEET_TEST_PG_HOST", "127.0.0.1"),
    "port": int(os.environ.get("FLEET_TEST_PG_PORT", "5432")),
    "user": os.environ.get("FLEET_TEST_PG_USER", "postgres"),
}


def _admin() -> psycopg2.extensions.connection:
    conn = psycopg2.connect(dbname="postgres", connect_timeout=3, **PG)
    conn.autocommit = True
    return conn


@pytest.fixture
def postgres_db() -> Iterator[str]:
    """A fresh database on the real server; dropped afterwards."""
    try:
        admin = _admin()
    except psycopg2.OperationalError as exc:
        pytest.skip(f"no PostgreSQL server at {PG['host']}:{PG['port']} ({exc})".strip())
    name = f"fleet_test_{uuid.uuid4().hex[:12]}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def postgres_home(postgres_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A DAGSTER_HOME whose dagster.yaml is the production storage block, as deployed."""
    production = yaml.safe_load((ROOT / "deploy" / "dagster" / "dagster.yaml").read_text())
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump({"storage": production["storage"]}))
    monkeypatch.setenv("DAGSTER_PG_HOST", PG["host"])
    monkeypatch.setenv("DAGSTER_PG_USER", PG["user"])
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", os.environ.get("FLEET_TEST_PG_PASSWORD", ""))
    monkeypatch.setenv("DAGSTER_PG_DB", postgres_db)
    assert PG["port"] == production["storage"]["postgres"]["postgres_db"]["port"]
    return home


def test_deliberation_is_stored_in_postgres(stack_env, postgres_home: Path, postgres_db: str):
    task_id = "pg-add-1"
    task = {"description": "Write a Python function add(a, b).", "role": "DEV", "num_agents": 2, "rounds": 0}
    with dg.DagsterInstance.from_config(str(postgres_home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        result = materialize_deliberation(instance, stack_env, task_id, task)
        assert result.success
        run_id = result.run_id
        materialized = len(result.get_asset_materialization_events())
        assert materialized >= 5  # deliberation_task, proposals, reviews, scores, decision

    # A new instance (another process in production: webserver, daemon) reads it all back.
    with dg.DagsterInstance.from_config(str(postgres_home)) as instance:
        assert instance.get_run_by_id(run_id).is_success
        assert instance.get_dynamic_partitions(deliberation_partitions.name) == [task_id]
        event = instance.get_latest_materialization_event(dg.AssetKey("decision"))
        assert event is not None and event.dagster_event.partition == task_id

    # And the rows are in the server's database, not in a local file.
    conn = psycopg2.connect(dbname=postgres_db, **PG)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,))
            assert cur.fetchone() == ("SUCCESS",)
            cur.execute(
                "SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
                (run_id, "ASSET_MATERIALIZATION"),
            )
            assert cur.fetchone()[0] == materialized
    finally:
        conn.close()


def chart_home(tmp_path: Path, values: dict, postgres_db: str) -> Path:
    """A DAGSTER_HOME whose dagster.yaml is the storage the chart renders from `values`, pointed
    at the test database (the pod gets DAGSTER_PG_PASSWORD from dagster-postgresql-secret)."""
    values = copy.deepcopy(values)
    values["postgresql"].update(
        postgresqlHost=PG["host"], postgresqlUsername=PG["user"], postgresqlDatabase=postgres_db
    )
    values["postgresql"]["service"]["port"] = PG["port"]
    home = tmp_path / "chart_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(chart_storage(values)))
    return home


def test_the_storage_the_chart_renders_loads(
    postgres_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", os.environ.get("FLEET_TEST_PG_PASSWORD", ""))
    with dg.DagsterInstance.from_config(str(chart_home(tmp_path, VALUES, postgres_db))) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        assert instance.get_runs() == []  # the tables exist: the storage connected and migrated


def test_without_the_scheme_the_chart_storage_needs_psycopg_3(
    postgres_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The failure deploy/helm/dagster-values.yaml's postgresqlScheme prevents: a plain
    postgresql:// URL makes SQLAlchemy 2.x load psycopg 3, which the image does not install."""
    try:
        import psycopg  # noqa: F401

        pytest.skip("psycopg 3 is installed here, unlike in the image: the failure cannot show")
    except ModuleNotFoundError:
        pass
    values = copy.deepcopy(VALUES)
    del values["postgresql"]["postgresqlScheme"]
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", os.environ.get("FLEET_TEST_PG_PASSWORD", ""))
    home = chart_home(tmp_path, values, postgres_db)
    with (
        pytest.raises(ModuleNotFoundError, match="psycopg"),
        dg.DagsterInstance.from_config(str(home)) as instance,
    ):
        instance.get_runs()
