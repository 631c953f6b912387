"""Scale: a Dagster instance holding 10,000 then 50,000 deliberation partitions.

Fills an instance (SQLite as `make dev` has it, or PostgreSQL at 127.0.0.1:5432 in a database
created for the run and dropped after it) with deliberations shaped like real ones, 1,000 a day
going back in time: a partition, a `deliberation_job` run with the planning sensor's tags and run
key, a materialization of each of the five assets with the metadata the assets attach (the
decision's outcome included), and each asset's Parquet file. The content is small and synthetic:
this measures storage, not the engine. At each size it measures (median of repeats):

- a planning sensor tick with 100 new approved plans, run by the daemon's own sensor loop against
  the code location served over gRPC (read NATS, add partitions, check run keys, create and
  enqueue 100 runs);
- `fleet result` on the most recent task and on the oldest one (the lookup the CLI runs);
- the GraphQL queries behind the asset page and the partitions tab of `decision`;
- the retention job (at 10k nothing is old enough: the cost of looking; at 50k the catch-up).

Before the 50k retention run the decision log is built for every day (its cost per day is printed).
After it the live partition count is printed against the bound the age implies.

Prints figures and 10k -> 50k growth; asserts nothing. Run under `nice`; it takes minutes:
  .venv/bin/python benchmarks/scale.py --backend sqlite            # or postgres, or both
  .venv/bin/python benchmarks/scale.py --backend sqlite --sizes 1000,5000   # a quick look
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from functools import cached_property
from pathlib import Path

RETENTION_DAYS = 14
NEW_PLANS = 100
ROOT = Path(__file__).resolve().parents[1]
PG = {"host": "127.0.0.1", "port": 5432, "user": os.environ.get("FLEET_TEST_PG_USER", "postgres")}

ASSET_PAGE = """
query AssetPage($assetKey: AssetKeyInput!) {
  assetOrError(assetKey: $assetKey) {
    ... on Asset {
      key { path }
      assetMaterializations(limit: 1) { runId partition timestamp metadataEntries { label } }
      definition {
        id
        partitionDefinition { description }
        partitionStats { numMaterialized numMaterializing numFailed numPartitions }
      }
    }
  }
}
"""
PARTITIONS_TAB = """
query PartitionHealth($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      id
      partitionKeysByDimension { name partitionKeys }
      assetPartitionStatuses {
        ... on DefaultPartitionStatuses {
          materializedPartitions materializingPartitions failedPartitions
        }
      }
    }
  }
}
"""


PER_DAY = int(os.environ.get("FLEET_SCALE_PER_DAY", "1000"))  # deliberations a day (a quick look: fewer)


def median_s(fn, repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


class Filler:
    """Writes synthetic deliberations i = start..end-1; deliberation i is decided at
    `now - (total - i) * 86400 / PER_DAY`, so the last one filled is the most recent."""

    def __init__(self, instance, storage: Path, now: float, total: int):
        from fleet_pipelines.assets.deliberation import deliberation_assets
        from fleet_pipelines.domain.decision import Decision, RankedProposal
        from fleet_pipelines.domain.models import DeliberationStatus
        from fleet_pipelines.history.stored import dump_value

        self.instance, self.storage, self.now, self.total = instance, storage, now, total
        self.assets = [a.key for a in deliberation_assets]
        decision = Decision(
            status=DeliberationStatus.COMPLETED,
            winner_id="agent-dev-001",
            ranking=[
                RankedProposal(rank=1, agent_id="agent-dev-001", score=0.91),
                RankedProposal(rank=2, agent_id="agent-dev-002", score=0.84),
            ],
            reasons=["every agent delivered", "agent-dev-001 scored highest"],
            quorum=2,
            usable_agents=2,
            failed_agents=[],
            timed_out_agents=[],
            winner_content="```python\ndef add(a, b):\n    return a + b\n```",
        )
        self.file_bytes = dump_value(decision).encode()  # every asset's file: a small real one
        for key in self.assets:
            (storage / key.to_user_string()).mkdir(parents=True, exist_ok=True)
        backfill_column = instance.run_storage.has_backfill_id_column()  # one query, not one per run
        instance.run_storage.has_backfill_id_column = lambda: backfill_column

    def task_id(self, i: int) -> str:
        return f"scale-{i:06d}"

    def decided_at(self, i: int) -> float:
        return self.now - (self.total - i) * 86_400 / PER_DAY

    def _metadata(self, asset: str, i: int) -> dict:
        import dagster as dg

        turns = dg.MetadataValue.table(
            records=[
                dg.TableRecord({"agent_id": f"agent-dev-00{a}", "kind": "propose", "status": "completed"})
                for a in (1, 2)
            ],
            schema=dg.TableSchema(
                columns=[dg.TableColumn(c, "string") for c in ("agent_id", "kind", "status")]
            ),
        )
        preview = dg.MetadataValue.md("### agent-dev-001 · propose · round 0\n\n" + "x" * 1_500)
        if asset == "deliberation_task":
            return {
                "role": "DEV",
                "num_agents": 2,
                "rounds": 0,
                "description": dg.MetadataValue.md("Write add"),
            }
        if asset in ("proposals", "reviews"):
            return {"usable": 2, "turns": turns, "preview": preview, "tokens_out": 400}
        if asset == "scores":
            return {
                "scores": turns,
                "winner_proposal": preview,
                "evidence": dg.MetadataValue.json({"a": [1, 2]}),
            }
        return {
            "status": "COMPLETED",
            "winner": "agent-dev-001",
            "ranking": dg.MetadataValue.md("1. agent-dev-001 — 0.910\n2. agent-dev-002 — 0.840"),
            "reasons": dg.MetadataValue.md("- every agent delivered"),
            "outcome": dg.MetadataValue.json(
                {
                    "story_id": "story",
                    "plan_id": f"plan-{i // 5}",
                    "role": "DEV",
                    "status": "COMPLETED",
                    "winner_id": "agent-dev-001",
                    "scores": [
                        {"rank": 1, "agent_id": "agent-dev-001", "score": 0.91},
                        {"rank": 2, "agent_id": "agent-dev-002", "score": 0.84},
                    ],
                    "reasons": ["every agent delivered"],
                    "tokens_in": 1_200,
                    "tokens_out": 800,
                    "turns": 2,
                    "failed_turns": 0,
                }
            ),
        }

    def _deliberation(self, i: int):
        """The run (with the planning sensor's tags) and the five materialization events of one."""
        import dagster as dg
        from dagster._core.events import DagsterEvent, StepMaterializationData
        from dagster._core.events.log import EventLogEntry

        task_id, ts = self.task_id(i), self.decided_at(i)
        run = dg.DagsterRun(
            job_name="deliberation_job",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.SUCCESS,
            tags={
                "dagster/partition": task_id,
                "dagster/sensor_name": "planning_sensor",
                "dagster/run_key": f"key-{i}:{task_id}",
                "fleet/role": "DEV",
                "fleet/story_id": "story",
                "fleet/plan_id": f"plan-{i // 5}",
                "fleet/correlation_id": task_id,
            },
        )
        events = [
            EventLogEntry(
                error_info=None,
                level=logging.DEBUG,
                user_message="",
                run_id=run.run_id,
                timestamp=ts - (len(self.assets) - 1 - n) * 2.0,
                step_key=key.to_user_string(),
                job_name="deliberation_job",
                dagster_event=DagsterEvent(
                    dg.DagsterEventType.ASSET_MATERIALIZATION.value,
                    "deliberation_job",
                    event_specific_data=StepMaterializationData(
                        dg.AssetMaterialization(
                            asset_key=key, partition=task_id, metadata=self._metadata(key.to_user_string(), i)
                        )
                    ),
                ),
            )
            for n, key in enumerate(self.assets)
        ]
        return run, events

    def fill(self, start: int, end: int, chunk: int = 500) -> None:
        """Deliberations start..end-1. Rows go in with Dagster's own row builders, a chunk per
        transaction (one deliberation at a time through the storage API costs 0.1-0.5 s here: a
        SQLite run shard is created per run); the last one of the fill goes through the storage
        API so the asset's latest-materialization entries are Dagster's own."""
        from fleet_pipelines.assets.deliberation import deliberation_partitions
        from fleet_pipelines.history.stored import stored_path

        for batch in range(start, end, PER_DAY):
            ids = [self.task_id(i) for i in range(batch, min(end, batch + PER_DAY))]
            self.instance.add_dynamic_partitions(deliberation_partitions.name, ids)
        for first in range(start, end - 1, chunk):
            self._bulk([self._deliberation(i) for i in range(first, min(end - 1, first + chunk))])
        run, events = self._deliberation(end - 1)
        self.instance.add_run(run)
        for event in events:
            self.instance.event_log_storage.store_event(event)
        for i in range(start, end):
            for key in self.assets:
                stored_path(str(self.storage), key.to_user_string(), self.task_id(i)).write_bytes(
                    self.file_bytes
                )

    def _bulk(self, deliberations) -> None:
        from datetime import UTC, datetime

        from dagster._core.storage.event_log.schema import SqlEventLogStorageTable
        from dagster._core.storage.runs.schema import RunsTable, RunTagsTable

        runs, events = self.instance.run_storage, self.instance.event_log_storage
        run_rows, tag_rows = [], []
        for run, run_events in deliberations:
            decided = run_events[-1].timestamp
            row = runs._get_run_insertion_values(run, datetime.fromtimestamp(decided - 60, UTC))
            row.update(
                start_time=decided - 60,
                end_time=decided,
                update_timestamp=datetime.fromtimestamp(decided, UTC),
            )
            run_rows.append(row)
            tag_rows += [
                {"run_id": run.run_id, "key": k, "value": v} for k, v in run.tags_for_storage().items()
            ]
        with runs.connect() as conn:
            conn.execute(RunsTable.insert(), run_rows)
            conn.execute(RunTagsTable.insert(), tag_rows)
        rows = [events._event_to_row(e) for _, run_events in deliberations for e in run_events]
        with events.index_connection() as conn:  # SQLite: the cross-run index shard; PostgreSQL: the table
            conn.execute(SqlEventLogStorageTable.insert(), rows)
        if hasattr(events, "path_for_shard"):  # SQLite: each run's own shard, as the storage writes it
            for run, run_events in deliberations:
                shard = Path(events.path_for_shard(run.run_id))
                shutil.copyfile(self.shard_template, shard)
                events._initialized_dbs.add(run.run_id)
                with events.run_connection(run.run_id) as conn:
                    conn.execute(
                        SqlEventLogStorageTable.insert(), [events._event_to_row(e) for e in run_events]
                    )

    @cached_property
    def shard_template(self) -> Path:
        """An empty run shard, created by the storage itself."""
        events = self.instance.event_log_storage
        with events.run_connection("shard-template"):
            pass
        return Path(events.path_for_shard("shard-template"))


@contextmanager
def postgres_home(base: Path):
    import psycopg2
    import yaml

    admin = psycopg2.connect(dbname="postgres", connect_timeout=3, **PG)
    admin.autocommit = True
    name = f"fleet_scale_{uuid.uuid4().hex[:12]}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    production = yaml.safe_load((ROOT / "deploy" / "dagster" / "dagster.yaml").read_text())
    home = base / "home"
    home.mkdir()
    config = {"storage": production["storage"], "telemetry": {"enabled": False}}
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    os.environ.update(
        DAGSTER_PG_HOST=PG["host"],
        DAGSTER_PG_USER=PG["user"],
        DAGSTER_PG_PASSWORD=os.environ.get("FLEET_TEST_PG_PASSWORD", ""),
        DAGSTER_PG_DB=name,
    )
    try:
        yield home, name
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextmanager
def sqlite_home(base: Path):
    home = base / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    yield home, str(home)


def run_backend(backend: str, sizes: list[int], lookups_only: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp, ExitStack() as stack:
        base = Path(tmp)
        storage = base / "storage"
        os.environ["FLEET_STORAGE_PATH"] = str(storage)
        os.environ["FLEET_PLANNING_START"] = "first"
        home, where = stack.enter_context((postgres_home if backend == "postgres" else sqlite_home)(base))
        os.environ["DAGSTER_HOME"] = str(home)

        import dagster as dg
        from dagster._core.test_utils import create_test_daemon_workspace_context
        from dagster._core.workspace.load_target import ModuleTarget
        from dagster._daemon.sensor import execute_sensor_iteration
        from dagster_graphql.test.utils import execute_dagster_graphql

        from fleet_pipelines import stack as fleet_stack
        from fleet_pipelines.assets.deliberation import STORED_ASSETS
        from fleet_pipelines.events.planning import single_task_plan
        from fleet_pipelines.events.streams import PLAN_APPROVED
        from fleet_pipelines.history.log import build_day, day_of, read_log
        from fleet_pipelines.history.retention import expire
        from fleet_pipelines.history.status import task_result
        from fleet_pipelines.history.stored import frame_path
        from fleet_pipelines.names import DECISION_LOG, DELIBERATION_PARTITIONS
        from fleet_pipelines.resources.events import NatsResource

        port = fleet_stack.free_port()
        nats_server = fleet_stack.start_nats(base / "logs", port, base / "nats")
        stack.callback(nats_server.stop)
        os.environ["NATS_URL"] = f"nats://127.0.0.1:{port}"
        nats = NatsResource(url=os.environ["NATS_URL"])
        nats.ensure_streams()

        instance = stack.enter_context(dg.DagsterInstance.from_config(str(home)))
        workspace = stack.enter_context(
            create_test_daemon_workspace_context(
                ModuleTarget(
                    module_name="fleet_pipelines.definitions",
                    attribute=None,
                    working_directory=str(ROOT),
                    location_name="fleet",
                ),
                instance,
            )
        )

        base = str(storage)
        now = time.time()
        filler = Filler(instance, storage, now, total=max(sizes))
        logger = logging.getLogger("scale")
        logger.setLevel(logging.WARNING)
        figures: dict[int, dict[str, float]] = {}
        filled = 0
        plans_sent = 0

        def sensor_tick() -> float:
            nonlocal plans_sent
            task = {"description": "Write add(a, b).", "role": "DEV", "num_agents": 2, "rounds": 0}
            envelopes = [
                (
                    PLAN_APPROVED,
                    single_task_plan(
                        f"new-{plans_sent + k}",
                        task,
                        "bench",
                        f"p-{plans_sent + k}",
                        "bench",
                        f"k-{plans_sent + k}",
                    ),
                )
                for k in range(NEW_PLANS)
            ]
            nats.publish(envelopes)
            plans_sent += NEW_PLANS
            before = instance.get_runs_count(dg.RunsFilter(tags={"dagster/sensor_name": "planning_sensor"}))
            start = time.perf_counter()
            list(execute_sensor_iteration(workspace, logger, None, None))
            elapsed = time.perf_counter() - start
            after = instance.get_runs_count(dg.RunsFilter(tags={"dagster/sensor_name": "planning_sensor"}))
            if after - before != NEW_PLANS:
                raise RuntimeError(f"the tick created {after - before} runs, expected {NEW_PLANS}")
            return elapsed

        def no_stream(_task_id: str) -> int | None:
            return None

        def lookup(task_id: str, source: str) -> float:
            def once():
                return task_result(instance, base, task_id, no_stream)

            result = once()
            if result.source != source or result.status.value != "COMPLETED":
                raise RuntimeError(f"{task_id}: {result.status} from {result.source}, expected {source}")
            return median_s(once)

        def graphql(query: str) -> float:
            variables = {"assetKey": {"path": ["decision"]}}

            def once():
                result = execute_dagster_graphql(workspace.create_request_context(), query, variables)
                if result.errors:
                    raise RuntimeError(result.errors)

            return median_s(once, repeat=3)

        def measure(old_source: str, tick: bool = True) -> dict[str, float]:
            figures = {}
            if tick and not lookups_only:
                time.sleep(6)  # the planning sensor's minimum interval (5 s) since its last tick
                figures["sensor tick, 100 new plans"] = sensor_tick()
            figures["fleet result, recent task"] = lookup(filler.task_id(filled - 1), "live")
            figures["fleet result, oldest task"] = lookup(filler.task_id(0), old_source)
            if not lookups_only:
                figures["GraphQL asset page"] = graphql(ASSET_PAGE)
                figures["GraphQL partitions tab"] = graphql(PARTITIONS_TAB)
            return figures

        for size in sizes:
            start = time.perf_counter()
            filler.fill(filled, size)
            filled = size
            print(
                f"[{backend}] filled {size:,} deliberations in {time.perf_counter() - start:.0f} s",
                flush=True,
            )
            figures[size] = measure("live")
            print(
                f"[{backend}] {size:,}: " + json.dumps({k: round(v, 4) for k, v in figures[size].items()}),
                flush=True,
            )
            if lookups_only:
                continue
            keys = STORED_ASSETS
            start = time.perf_counter()
            if size != sizes[-1]:  # as of the newest one filled, nothing is old enough yet
                as_of = filler.decided_at(filled - 1) + 1
                expire(instance, base, DELIBERATION_PARTITIONS, keys, RETENTION_DAYS * 86_400, as_of)
                figures[size]["retention job, nothing to remove"] = time.perf_counter() - start
            else:
                days = sorted({day_of(filler.decided_at(i)) for i in range(size)})
                start = time.perf_counter()
                for day in days:
                    path = frame_path(base, DECISION_LOG, day)  # where the asset's IO manager writes
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with path.open("wb") as f:
                        build_day(instance, base, day).to_parquet(f, index=False)
                build = (time.perf_counter() - start) / len(days)
                figures[size][f"decision log, build one day ({PER_DAY:,} rows)"] = build
                start = time.perf_counter()
                report = expire(instance, base, DELIBERATION_PARTITIONS, keys, RETENTION_DAYS * 86_400, now)
                figures[size]["retention job, catch-up"] = time.perf_counter() - start
                live = len(instance.get_dynamic_partitions(DELIBERATION_PARTITIONS))
                bound = RETENTION_DAYS * PER_DAY + NEW_PLANS * len(sizes)
                removed = set(report.removed)
                logged = set()
                for day in days:
                    table = read_log(base, day)
                    logged |= set(table["task_id"]) if table is not None else set()
                print(
                    f"[{backend}] retention ({RETENTION_DAYS} days) in "
                    f"{figures[size]['retention job, catch-up']:.0f} s "
                    f"(log build {build:.2f} s/day): removed {len(removed):,} "
                    f"({report.files_removed:,} files), live partitions {live:,} (bound {bound:,}: "
                    f"{RETENTION_DAYS} days x {PER_DAY:,} + the bench's new plans), "
                    f"removed and not in the log: {len(removed - logged)}, kept as not logged: "
                    f"{len(report.not_logged)}",
                    flush=True,
                )
                figures["after retention"] = measure("decision_log", tick=False)
            print(
                f"[{backend}] {size:,}: " + json.dumps({k: round(v, 4) for k, v in figures[size].items()}),
                flush=True,
            )
        return {"backend": backend, "where": where, "figures": figures}


def print_table(result: dict, sizes: list[int]) -> None:
    figures = result["figures"]
    first, last = sizes[0], sizes[-1]
    print(f"\n{result['backend']} ({result['where']})")
    print(f"| what | {first:,} | {last:,} | growth | after retention |")
    print("|---|---|---|---|---|")
    names = list(dict.fromkeys([*figures[first], *figures[last]]))
    for name in names:
        a, b = figures[first].get(name), figures[last].get(name)
        after = figures.get("after retention", {}).get(name)
        growth = f"{b / a:.2f}x" if a and b else ""
        cell = lambda v: f"{v * 1000:.1f} ms" if v is not None else ""  # noqa: E731
        print(f"| {name} | {cell(a)} | {cell(b)} | {growth} | {cell(after)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--sizes", default="10000,50000", help="comma-separated partition counts")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--lookups-only",
        action="store_true",
        help="measure `fleet result` only (no tick, GraphQL, retention)",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.backend == "both":  # one process per backend: the code location reads env at import
        for backend in ("sqlite", "postgres"):
            subprocess.run(
                [sys.executable, __file__, "--backend", backend, "--sizes", args.sizes], check=False
            )
        return
    result = run_backend(args.backend, sizes, args.lookups_only)
    print_table(result, sizes)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
