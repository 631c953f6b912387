"""The task options of `fleet run` and `fleet deliberate`: tests and examples reach the task."""

from __future__ import annotations

import time
from pathlib import Path

from click.testing import CliRunner

from fleet_pipelines.cli import fleet
from fleet_pipelines.events.planning import plan_deliberations
from fleet_pipelines.events.streams import PLAN_APPROVED, PLANNING_STREAM
from fleet_pipelines.resources.events import NatsResource


def published_plans(nats: NatsResource) -> list:
    async def read(session):
        return [
            m
            async for m in session.read_after(PLANNING_STREAM, PLAN_APPROVED, 0, 1_000, time.monotonic() + 5)
        ]

    return [p for m in nats.session(read) for p in plan_deliberations(m)]


def test_deliberate_carries_tests_and_examples_into_the_task(tmp_path: Path, nats_resource: NatsResource):
    """On a nats-server of the test's own (`nats_resource`)."""
    tests = tmp_path / "test_add.py"
    tests.write_text("def test_add():\n    assert add(2, 3) == 5\n")
    args = [
        "deliberate",
        "Write add(a, b).",
        "--role",
        "qa",
        "--tests",
        str(tests),
        "--task-id",
        "cli-tests-1",
    ]
    args += ["--example", "add(2, 2) => 4", "--example", "add('a', 'b') => 'ab'"]
    done = CliRunner().invoke(fleet, args, env={"NATS_URL": nats_resource.url})
    assert done.exit_code == 0, done.output
    [planned] = published_plans(nats_resource)
    assert planned.task_id == "cli-tests-1"
    assert planned.role == "QA"
    assert planned.task_config["tests"] == tests.read_text()
    assert planned.task_config["examples"] == [
        {"call": "add(2, 2)", "expected": "4"},
        {"call": "add('a', 'b')", "expected": "'ab'"},
    ]


def test_an_example_without_an_arrow_is_a_usage_error(nats_server: str):
    for verb in ("run", "deliberate"):
        done = CliRunner().invoke(fleet, [verb, "Write add(a, b).", "--example", "add(2, 2) is 4"])
        assert done.exit_code == 2 and "expected 'CALL => EXPECTED'" in done.output


def test_an_invalid_task_is_refused_before_anything_runs(tmp_path: Path, nats_server: str):
    done = CliRunner().invoke(
        fleet, ["run", "Write add(a, b).", "--agents", "11"], env={"FLEET_STATE_DIR": str(tmp_path)}
    )
    assert done.exit_code == 2
    assert "num_agents: Input should be less than or equal to 10" in done.output


def test_fleet_runs_progress_shows_phases_turn_lines_and_warnings_not_dagsters_debug_log(capsys):
    import dagster as dg

    from fleet_pipelines.cli.run import run_loggers

    @dg.asset
    def proposals(context) -> int:
        context.log.info("turn agent-dev-001 propose r0: completed, 12 tokens, queue 0.0 s, service 1.0 s")
        context.log.info("2/2 proposals from the engine")  # Dagster's log only
        context.log.warning("1 progress chunks could not be published")
        return 1

    job = dg.Definitions(assets=[proposals], jobs=[dg.define_asset_job("j")]).resolve_job_def("j")
    progress = "proposals …\n  agent-dev-001 propose r0: completed, 12 tokens, queue 0.0 s, service 1.0 s\n"
    for verbose in (False, True):
        loggers, config = run_loggers(verbose)
        assert job.with_logger_defs(loggers).execute_in_process(run_config={"loggers": config}).success
        out, err = capsys.readouterr()
        if verbose:  # --verbose: Dagster's own log as well, debug events included
            assert out.startswith(progress) and "STEP_START" in err and "2/2 proposals from the engine" in err
        else:
            assert out == progress and err == "  warning: 1 progress chunks could not be published\n"


def test_a_failed_run_says_why_with_each_cause_of_its_first_failure():
    import dagster as dg

    from fleet_pipelines.cli.run import failure_chain

    @dg.resource
    def cluster(_):
        try:
            raise RuntimeError("Failed to connect to GCS.\nLast connection error: Traceback …")
        except RuntimeError as exc:
            raise ConnectionError("the Ray cluster refused this process's token") from exc

    @dg.asset(required_resource_keys={"cluster"})
    def proposals() -> int:
        return 1

    defs = dg.Definitions(assets=[proposals], jobs=[dg.define_asset_job("j")], resources={"cluster": cluster})
    chain = failure_chain(defs.resolve_job_def("j").execute_in_process(raise_on_error=False))
    assert chain[-2:] == [
        "ConnectionError: the Ray cluster refused this process's token",
        "RuntimeError: Failed to connect to GCS.",
    ], chain
