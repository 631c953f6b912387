"""Councils as configuration: the councils file, its validation, `fleet councils`, and a run that
takes its council (agents, engine, budgets, rubric, weights) from it and shows which it used."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner

from fleet_pipelines.cli import fleet
from fleet_pipelines.domain.councils import CouncilsFileError, parse_councils
from fleet_pipelines.domain.limits import SandboxLimits
from fleet_pipelines.domain.models import Role, Task, TurnKind
from fleet_pipelines.resources.config import (
    EngineConfig,
    OpenAIEngineConfig,
    SandboxLimitsConfig,
    ScoringWeightsConfig,
)
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.resources.ray_cluster import RayCluster
from fleet_pipelines.resources.turns import RayTurnRunner
from tests.jobs import deliberation_defs, deliberation_resources, run_deliberation
from tests.scripted import ScriptedTurnRunner, recorded

COUNCILS = """\
version: "2026-11-26.1"
engines:
  coder: {base_url: "http://127.0.0.1:9101/v1", model: coder-model}
  tester: {base_url: "http://127.0.0.1:9102", model: tester-model}
councils:
  DEV:
    engine: coder
    agents: [{temperature: 0.1}, {temperature: 1.1, diversity: true}]
    budgets: {propose: 200, critique: 100}
    judge_max_tokens: 64
    rubric: "Pure functions only."
    weights: {tests: 0.9, sections: 0}
    execution_feedback: false
  QA:
    engine: tester
"""


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("version: v\ncouncils: {DEV: {agents: [{temperature: 2.5}]}}", "councils.DEV.agents.0.temperature"),
        ("version: v\ncouncils: {CHEF: {}}", "councils.CHEF"),
        (
            "version: v\ncouncils: {DEV: {engine: big}}",
            "councils.DEV.engine: 'big' is not an entry of engines",
        ),
        ("version: v\ncouncils: {DEV: {weights: {speed: 1}}}", "councils.DEV.weights.speed"),
        ("version: v\ncouncils: {DEV: {max_tokens: 4}}", "councils.DEV.max_tokens"),
        ("version: v\ncouncils: {DEV: {budgets: {judge: 64}}}", "councils.DEV.budgets.judge"),
        ("version: v\ncouncils: {DEV: {budgets: {propose: 8}}}", "councils.DEV.budgets.propose"),
        ("version: v\nengines: {e: {base_url: x}}", "engines.e.model"),
        ("councils: {}", "version"),
        ("version: v\ncouncil: {}", "council"),
        ("- a list", "expected a mapping"),
    ],
)
def test_a_bad_councils_file_fails_naming_the_field(text: str, field: str):
    with pytest.raises(CouncilsFileError) as caught:
        parse_councils(text, source="councils.yaml")
    assert str(caught.value).startswith("councils.yaml: ") and field in str(caught.value)


def test_fleet_councils_list_show_validate(tmp_path: Path):
    good, bad = tmp_path / "councils.yaml", tmp_path / "bad.yaml"
    good.write_text(COUNCILS)
    bad.write_text(COUNCILS.replace("temperature: 0.1", "temperature: -1"))
    listed = CliRunner().invoke(fleet, ["councils", "list", "--file", str(good)])
    assert listed.exit_code == 0, listed.output
    assert "version 2026-11-26.1" in listed.output
    assert (
        "DEV        engine coder (coder-model at http://127.0.0.1:9101/v1); agents [0.1, 1.1*, 0.1]"
        in listed.output
    )
    shown = CliRunner().invoke(fleet, ["councils", "show", "qa"], env={"FLEET_COUNCILS_FILE": str(good)})
    assert shown.exit_code == 0, shown.output
    qa = json.loads(shown.output)
    assert qa["engine"] == {
        "name": "tester",
        "base_url": "http://127.0.0.1:9102",
        "model": "tester-model",
        "slots": None,
        "api_key_env": None,
        "tool_protocol": None,
    }
    assert qa["weights"]["tests"] == 0.35  # defaults filled in
    valid = CliRunner().invoke(fleet, ["councils", "validate", "--file", str(good)])
    assert valid.exit_code == 0 and "valid, version 2026-11-26.1, 2 council(s), 2 engine(s)" in valid.output
    invalid = CliRunner().invoke(fleet, ["councils", "validate", "--file", str(bad)])
    assert invalid.exit_code == 2 and "councils.DEV.agents.0.temperature" in invalid.output
    missing = CliRunner().invoke(fleet, ["councils", "validate"], env={"FLEET_COUNCILS_FILE": ""})
    assert missing.exit_code == 2 and "no councils file" in missing.output


def run(tmp_path: Path, nats_url: str, councils_file: str, fields: dict, log: Path):
    runner = ScriptedTurnRunner(code="def f(x):\n    return x", record_to=str(log))
    council = CouncilResource(councils_file=councils_file)
    defs = deliberation_defs(
        deliberation_resources(tmp_path / "storage", NatsResource(url=nats_url), runner, council)
    )
    with dg.DagsterInstance.ephemeral() as instance:
        return run_deliberation(defs, instance, "c-1", fields, raise_on_error=False)


def test_a_run_takes_its_council_from_the_file_and_shows_it(tmp_path: Path, nats_server: str):
    path, log = tmp_path / "councils.yaml", tmp_path / "requests.jsonl"
    path.write_text(COUNCILS)
    fields = {"description": "Write f(x).", "role": "DEV", "num_agents": 3, "rounds": 1}
    result = run(tmp_path, nats_server, str(path), fields, log)
    assert result.success
    requests = recorded(log)
    proposals = [r for r in requests if r.kind is TurnKind.PROPOSE]
    assert [r.temperature for r in proposals] == [0.1, 1.1, 0.1]  # profiles cycled over 3 agents
    budgets = {TurnKind.PROPOSE: 200, TurnKind.CRITIQUE: 100, TurnKind.REVISE: 256}  # revise: default
    assert all(r.max_tokens == budgets[r.kind] for r in requests if r.kind is not TurnKind.JUDGE)
    assert all(r.max_tokens == 64 for r in requests if r.kind is TurnKind.JUDGE)
    assert "Evaluation rubric: Pure functions only." in proposals[0].messages[0].content
    assert all("checks ran" not in r.messages[-1].content for r in requests if r.kind is TurnKind.REVISE)
    assert {t.model for t in result.output_for_node("proposals")} == {"coder-model"}  # the DEV engine
    [meta] = result.asset_materializations_for_node("council")
    assert meta.metadata["councils_file_version"].value == "2026-11-26.1"
    council = meta.metadata["council"].value
    assert council["engine"]["model"] == "coder-model" and council["weights"]["tests"] == 0.9
    assert council["budgets"] == {"propose": 200, "critique": 100, "revise": 256}

    qa = run(tmp_path / "qa", nats_server, str(path), {**fields, "role": "QA"}, tmp_path / "qa.jsonl")
    assert {t.model for t in qa.output_for_node("proposals")} == {"tester-model"}

    path.write_text(COUNCILS.replace("engine: tester", "engine: nowhere"))
    broken = run(tmp_path / "broken", nats_server, str(path), fields, tmp_path / "b.jsonl")
    assert not broken.success
    failure = next(e for e in broken.all_events if e.is_step_failure)
    assert (
        "councils.QA.engine: 'nowhere' is not an entry of engines" in failure.step_failure_data.error.message
    )


def test_without_a_file_the_council_is_the_resources():
    task = Task(task_id="t", description="d", role=Role.DEV, num_agents=2)
    convened = CouncilResource(temperature=0.5).convene(task)
    assert [a.temperature for a in convened.agents] == [0.5, 0.65]
    assert convened.engine is None and convened.version is None and convened.task == task
    assert convened.quorum is None and convened.sandbox == SandboxLimits()
    assert convened.summary()["quorum"] == 2 and convened.summary()["sandbox"]["wall_s"] == 10.0


def test_the_convened_council_carries_the_resources_sandbox_limits_and_quorum():
    resource = CouncilResource(quorum=1, sandbox=SandboxLimitsConfig(wall_s=3, memory_mb=256))
    convened = resource.convene(Task(task_id="t", description="d", role=Role.DEV, num_agents=3))
    assert convened.quorum == 1 and convened.sandbox == SandboxLimits(wall_s=3, memory_mb=256)
    summary = convened.summary()
    assert summary["quorum"] == 1 and summary["sandbox"]["memory_mb"] == 256


def test_a_role_the_file_does_not_name_keeps_every_configured_value(tmp_path: Path):
    path = tmp_path / "councils.yaml"
    path.write_text(COUNCILS)
    configured = CouncilResource(
        temperature=0.5,
        judge_max_tokens=99,
        weights=ScoringWeightsConfig(tests=0.9, lint=0.3),
        councils_file=str(path),
    )
    architect = configured.convene(Task(task_id="t", description="d", role=Role.ARCHITECT, num_agents=2))
    assert architect.weights.tests == 0.9 and architect.weights.lint == 0.3  # was 0.35 and 0.10
    assert architect.judge_max_tokens == 99 and [a.temperature for a in architect.agents] == [0.5, 0.65]
    # A role the file names: its values over the configured ones, the rest configured.
    dev = configured.convene(Task(task_id="t", description="d", role=Role.DEV))
    assert dev.weights.tests == 0.9 and dev.weights.sections == 0 and dev.weights.lint == 0.3
    assert dev.judge_max_tokens == 64


def test_councils_list_and_show_work_without_a_file_and_say_where_values_come_from(tmp_path: Path):
    env = {"FLEET_COUNCILS_FILE": "", "FLEET_MAX_TOKENS": "96"}
    listed = CliRunner().invoke(fleet, ["councils", "list"], env=env)
    assert listed.exit_code == 0, listed.output
    assert "no councils file (FLEET_COUNCILS_FILE): the built-in councils" in listed.output
    assert [line.split()[0] for line in listed.output.splitlines()[1::2]] == [r.value for r in Role]
    assert "budgets propose 96, critique 96, revise 96" in listed.output  # FLEET_MAX_TOKENS
    shown = json.loads(CliRunner().invoke(fleet, ["councils", "show", "devops"], env=env).output)
    assert shown["file"] is None and shown["engine"] == "the stack's engine"
    assert [a["agent_id"] for a in shown["agents"]] == [f"agent-devops-00{i}" for i in (1, 2, 3)]
    assert shown["sources"]["council resource"] == "the rest (FLEET_MAX_TOKENS and the built-in defaults)"

    path = tmp_path / "councils.yaml"
    path.write_text(COUNCILS)
    listed = CliRunner().invoke(fleet, ["councils", "list", "--file", str(path)], env=env)
    [dev_sources] = [line for line in listed.output.splitlines() if "councils file: agents" in line]
    assert "budgets.critique, budgets.propose, engine, execution_feedback" in dev_sources
    assert "weights.sections, weights.tests" in dev_sources
    assert listed.output.count("councils file: nothing") == 3  # ARCHITECT, DEVOPS, DATA
    # show prints the council that would run: the file's profiles cycled over the default size.
    dev = json.loads(
        CliRunner().invoke(fleet, ["councils", "show", "dev", "--file", str(path)], env=env).output
    )
    assert [a["temperature"] for a in dev["agents"]] == [0.1, 1.1, 0.1]
    # The file's budgets replace FLEET_MAX_TOKENS for the role; revise keeps the resource's budget.
    assert (
        dev["budgets"] == {"propose": 200, "critique": 100, "revise": 256} and dev["judge_max_tokens"] == 64
    )


ENGINES = """\
version: e1
engines:
  big: {base_url: "http://10.0.0.7:8000/v1", model: big-model, slots: 16, api_key_env: BIG_ENGINE_KEY}
councils:
  ARCHITECT: {engine: big}
"""


def test_a_role_engine_has_its_own_slots_key_and_run_queue_tag(tmp_path: Path, monkeypatch):
    path = tmp_path / "councils.yaml"
    path.write_text(ENGINES)
    council = CouncilResource(councils_file=str(path))
    convened = council.convene(Task(task_id="t", description="d", role=Role.ARCHITECT))
    monkeypatch.setenv("BIG_ENGINE_KEY", "sk-big")
    stack = RayTurnRunner(
        engine=EngineConfig(
            openai=OpenAIEngineConfig(base_url="http://127.0.0.1:8080/v1", model="m", slots=2)
        ),
        ray_cluster=RayCluster(),
    )
    settings = stack.role_engine(convened.engine)
    assert (settings.base_url, settings.model, settings.slots) == ("http://10.0.0.7:8000/v1", "big-model", 16)
    assert settings.api_key.get_secret_value() == "sk-big"
    assert settings.tool_protocol == "json"  # the file names none: the stack engine's
    tooled = convened.engine.model_copy(update={"tool_protocol": "openai"})
    assert stack.tool_protocol(tooled) == "openai" and stack.tool_protocol(None) == "json"
    # The run queue limits runs per engine by this tag: a run request's tags win over the job's
    # (dagster 1.13.27, _daemon/sensor.py `_get_or_create_sensor_run`: {**job run tags, **request tags}).
    assert council.engine_tags("ARCHITECT") == {"fleet/engine": "10.0.0.7:8000"}
    assert council.engine_tags("DEV") == {}  # the stack's engine: the job's tag
    monkeypatch.delenv("BIG_ENGINE_KEY")
    with pytest.raises(dg.Failure, match="BIG_ENGINE_KEY is not set"):
        stack.role_engine(convened.engine)


class RewritingRunner(ScriptedTurnRunner):
    """Rewrites the councils file while the proposals are written (an operator editing it mid-run)."""

    councils_file: str = ""
    rewritten: str = ""

    def run_turns(self, requests, turn):
        Path(self.councils_file).write_text(self.rewritten)
        return super().run_turns(requests, turn)


def test_the_council_is_convened_once_per_run_and_a_file_changed_mid_run_does_not_change_it(
    tmp_path: Path, nats_server: str
):
    path, log = tmp_path / "councils.yaml", tmp_path / "requests.jsonl"
    path.write_text(COUNCILS)
    runner = RewritingRunner(
        code="def f(x):\n    return x",
        record_to=str(log),
        councils_file=str(path),
        rewritten=COUNCILS.replace("judge_max_tokens: 64", "judge_max_tokens: 32").replace(
            "2026-11-26.1", "v2"
        ),
    )
    council = CouncilResource(councils_file=str(path))
    defs = deliberation_defs(
        deliberation_resources(tmp_path / "storage", NatsResource(url=nats_server), runner, council)
    )
    fields = {"description": "Write f(x).", "role": "DEV", "num_agents": 2, "rounds": 0}
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_deliberation(defs, instance, "once-1", fields)
    assert result.success and path.read_text().count("judge_max_tokens: 32") == 1  # rewritten mid-run
    judged = [r for r in recorded(log) if r.kind is TurnKind.JUDGE]
    assert judged and all(r.max_tokens == 64 for r in judged)  # the council of the run's start
    [council] = result.asset_materializations_for_node("council")
    assert council.metadata["councils_file_version"].value == "2026-11-26.1"
    # Every step after it reads the `council` asset: lineage shows which council decided.
    graph = defs.resolve_asset_graph()
    readers = {key.to_user_string() for key in graph.get(dg.AssetKey("council")).child_keys}
    assert readers == {"proposals", "reviews", "scores", "decision", "winning_branch", "decision_events"}
