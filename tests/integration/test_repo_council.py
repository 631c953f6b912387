"""A council on a real repository (the generated `calc-add` case: test_add fails), with the
scripted runner, the real sandbox, git and NATS: each agent's proposal is a patch scored in a
fresh sandboxed copy by the repository's own tests and the hidden tests.

- agent-dev-001's patch fixes add but breaks mul: it applies, another test fails, it loses;
- agent-dev-002's patch does not apply: tests score 0;
- agent-dev-003's patch fixes it and wins; it is pushed to a local bare repository as
  `fleet/{task_id}`, `fleet result --patch` prints it and the outcome event carries it.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner

from fleet_pipelines.assets.deliberation import (
    build_deliberation_job,
    deliberation_assets,
    deliberation_run_config,
)
from fleet_pipelines.assets.partitions import deliberation_partitions
from fleet_pipelines.cli import fleet as fleet_cli
from fleet_pipelines.domain.decision import Decision
from fleet_pipelines.domain.models import TurnResult
from fleet_pipelines.domain.scoring import ProposalScore
from fleet_pipelines.domain.workspace import PushedBranch, Workspace
from fleet_pipelines.evaluation.repo_suite import REPO_CASES, create_repo, repo_task_fields
from fleet_pipelines.events.streams import streaming_subject
from fleet_pipelines.history.stored import read_stored
from fleet_pipelines.names import DELIBERATION_JOB
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.resources.io import DomainIOManager
from fleet_pipelines.resources.repos import ReposResource
from fleet_pipelines.sandbox import isolation_available
from fleet_pipelines.workspace.push import remote_branch_commit
from tests.scripted import ScriptedTurnRunner

pytestmark = pytest.mark.skipif(not isolation_available()[0], reason="needs the bubblewrap sandbox")

CASE = REPO_CASES[0]  # calc-add
BREAKS_MUL = """--- a/calc.py
+++ b/calc.py
@@ -2,8 +2,8 @@
 
 
 def add(a, b):
-    return a - b
+    return a + b
 
 
 def mul(a, b):
-    return a * b
+    return a ** b
"""
DOES_NOT_APPLY = """--- a/calc.py
+++ b/calc.py
@@ -1,3 +1,3 @@
 def add(x, y):
-    return x - y
+    return x + y
 
"""


TOOL_REPLIES = [  # agent-dev-003 looks before it answers: two calls, then one it cannot parse
    'Let me look.\n<tool_call>{"name": "read_file", "arguments": {"path": "calc.py"}}',
    '<tool_call>{"name": "run_tests", "arguments": {"patch": ' + json.dumps(CASE.fix) + "}}",
    "<tool_call>{name: search_text}</tool_call>",
]


@pytest.fixture
def workspaces(traversable_dir: Path) -> Path:
    """The workspace root: a folder the sandbox's uids can traverse."""
    return traversable_dir


def test_the_patch_that_fixes_the_repository_wins_and_is_pushed(
    tmp_path: Path, nats_resource, workspaces: Path
):
    source = create_repo(CASE, tmp_path / "calc")
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(remote)], check=True)
    task_id = "repo-calc-1"
    runner = ScriptedTurnRunner(
        patches={"agent-dev-001": BREAKS_MUL, "agent-dev-002": DOES_NOT_APPLY, "agent-dev-003": CASE.fix},
        tool_replies={"agent-dev-003": TOOL_REPLIES},
    )
    storage = tmp_path / "storage"
    repos = ReposResource(root=str(workspaces), push_remote=str(remote))
    defs = dg.Definitions(
        assets=deliberation_assets,
        jobs=[build_deliberation_job()],
        resources={
            "turn_runner": runner,
            "council": CouncilResource(),
            "repos": repos,
            "io_manager": DomainIOManager(base_path=str(storage)),
            "nats": nats_resource,
        },
    )
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
        result = defs.resolve_job_def(DELIBERATION_JOB).execute_in_process(
            run_config=deliberation_run_config(repo_task_fields(CASE, source, agents=3, rounds=1)),
            instance=instance,
            partition_key=task_id,
        )
        pushed = instance.get_latest_materialization_event(dg.AssetKey("winning_branch"))
        observed = instance.fetch_observations(dg.AssetKey("decision"), limit=1).records
    assert result.success
    assert pushed.asset_materialization.metadata["pushed_branch"].value == f"fleet/{task_id}"
    assert observed[0].asset_observation.metadata["pushed_branch"].value == f"fleet/{task_id}"
    branch: PushedBranch = read_stored(str(storage), "winning_branch", task_id)
    assert branch.branch == f"fleet/{task_id}" and branch.remote == str(remote)

    workspace: Workspace = read_stored(str(storage), "workspace", task_id)
    head = subprocess.run(["git", "-C", str(source), "rev-parse", "main"], capture_output=True, text=True)
    assert workspace.commit == head.stdout.strip()  # the ref resolved and recorded
    assert {f.path for f in workspace.files} == {"calc.py", "tests/test_calc.py"}
    assert workspace.baseline is not None and workspace.baseline.status == "failed"
    assert (workspace.baseline.passed, workspace.baseline.failed) == (1, 1)
    assert workspace.baseline.failing == ["tests.test_calc::test_add"]

    scores: list[ProposalScore] = read_stored(str(storage), "scores", task_id)
    by_agent = {s.agent_id: s for s in scores}
    fixer, breaker, broken = by_agent["agent-dev-003"], by_agent["agent-dev-001"], by_agent["agent-dev-002"]
    assert fixer.value("patch_applies") == 1.0 and fixer.value("tests") == 1.0
    assert "before: 1 passed, 1 failing" in fixer.check("tests").evidence
    assert broken.value("patch_applies") == 0.0 and broken.value("tests") == 0.0
    assert breaker.value("patch_applies") == 1.0
    # test_mul (passing on the base) and the hidden mul test fail, the hidden add test passes, and
    # so does test_add: it fails on the base and the task names it (a fail-to-pass test): 2 of 4
    assert breaker.value("tests") == 0.5
    assert "1 of the 1 failing tests the task names now pass" in breaker.check("tests").evidence
    assert "test_mul" in breaker.check("tests").output
    assert fixer.score > breaker.score > broken.score

    proposals: list[TurnResult] = read_stored(str(storage), "proposals", task_id)
    looked = next(p for p in proposals if p.agent_id == "agent-dev-003")
    steps = looked.tool_steps
    assert [(s.name, s.parsed) for s in steps] == [("read_file", True), ("run_tests", True), ("?", False)]
    assert "5:     return a - b" in steps[0].output
    assert steps[1].output.startswith("tests passed (2 passed, 0 failing)")
    assert steps[2].text == "{name: search_text}" and steps[2].output.startswith("error: not JSON")
    assert looked.engine_calls == 4 and looked.tool_ms > 0 and CASE.fix in looked.content
    chunks = streamed(nats_resource, task_id, "agent-dev-003")  # the live progress of that turn
    assert [c["seq"] for c in chunks] == list(range(len(chunks))) and chunks[-1]["done"]
    text = "".join(c["text"] for c in chunks)
    assert (
        '[tool read_file {"path": "calc.py"}' in text
        and "[tool run_tests" in text
        and "[tool ? '{name" in text
    )
    assert text.index("[tool read_file") < text.index("[tool run_tests") < text.index(CASE.fix)
    others = [p for p in proposals if p.agent_id != "agent-dev-003"]
    assert all(p.engine_calls == 1 and not p.tool_steps for p in others)  # answered at once

    decision: Decision = read_stored(str(storage), "decision", task_id)
    assert decision.winner_id == "agent-dev-003"
    assert decision.winner_patch == CASE.fix
    assert decision.base_commit == workspace.commit
    pushed = remote_branch_commit(str(remote), task_id)
    assert pushed is not None
    calc = subprocess.run(
        ["git", "--git-dir", str(remote), "show", f"{pushed}:calc.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "return a + b" in calc and "return a * b" in calc
    parent = subprocess.run(
        ["git", "--git-dir", str(remote), "rev-parse", f"{pushed}^"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert parent == workspace.commit

    cli = CliRunner().invoke(
        fleet_cli, ["result", task_id, "--patch"], env={"FLEET_STORAGE_PATH": str(storage)}
    )
    assert cli.exit_code == 0, cli.output
    assert cli.output == CASE.fix
    shown = CliRunner().invoke(fleet_cli, ["result", task_id], env={"FLEET_STORAGE_PATH": str(storage)})
    assert f"winning patch, pushed as fleet/{task_id}:" in shown.output, shown.output


def test_when_no_patch_applies_the_decision_says_so_and_the_winner_fails_its_checks(
    tmp_path: Path, nats_resource, workspaces: Path
):
    """Every agent's patch fails to apply: the deliberation completes, but its decision says first
    and plainly that no candidate's patch applied, carries no patch, winner_passes_checks fails,
    and `fleet result` prints it."""
    source = create_repo(CASE, tmp_path / "calc")
    task_id = "repo-calc-none"
    runner = ScriptedTurnRunner(patches={f"agent-dev-00{i}": DOES_NOT_APPLY for i in (1, 2, 3)})
    storage = tmp_path / "storage"
    defs = dg.Definitions(
        assets=deliberation_assets,
        jobs=[build_deliberation_job()],
        resources={
            "turn_runner": runner,
            "council": CouncilResource(),
            "repos": ReposResource(root=str(workspaces)),
            "io_manager": DomainIOManager(base_path=str(storage)),
            "nats": nats_resource,
        },
    )
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
        result = defs.resolve_job_def(DELIBERATION_JOB).execute_in_process(
            run_config=deliberation_run_config(repo_task_fields(CASE, source, agents=3, rounds=0)),
            instance=instance,
            partition_key=task_id,
        )
    assert result.success
    decision: Decision = read_stored(str(storage), "decision", task_id)
    assert decision.status == "COMPLETED" and decision.winner_id is not None
    assert decision.reasons[0].startswith("no candidate's patch applied to ")
    assert decision.winner_patch == ""
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert not checks["winner_passes_checks"].passed
    assert "patch_applies = 0.00" in checks["winner_passes_checks"].description
    cli = CliRunner().invoke(fleet_cli, ["result", task_id], env={"FLEET_STORAGE_PATH": str(storage)})
    assert cli.exit_code == 0, cli.output
    assert "no candidate's patch applied to " in cli.output


def streamed(nats_resource, task_id: str, agent_id: str) -> list[dict]:
    """The chunks of an agent's proposal turn on vllm.streaming.{task_id}, in stream order."""

    async def read(session) -> list[dict]:
        out = []
        deadline = time.monotonic() + 10
        async for message in session.read_after(
            "VLLM_STREAMING", streaming_subject(task_id), 0, 10_000, deadline
        ):
            out.append(json.loads(message.data)["payload"])
        return out

    return [c for c in nats_resource.session(read) if c["agent_id"] == agent_id and c["kind"] == "propose"]


def test_the_outcome_event_carries_the_patch_size_bounded():
    from fleet_pipelines.domain.models import Task
    from fleet_pipelines.events.outbound import decision_outcome

    big = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n" + "".join(f"+line {i}\n" for i in range(5_000))
    decision = Decision(
        status="COMPLETED",
        winner_id="agent-dev-001",
        ranking=[],
        reasons=[],
        quorum=1,
        usable_agents=1,
        failed_agents=[],
        timed_out_agents=[],
        winner_patch=big,
        base_commit="a" * 40,
    )
    task = Task.from_fields("t1", {"description": "d", "role": "DEV"})
    outcome = decision_outcome(task, decision, "run-1", 1.0)
    assert outcome.patch_truncated and outcome.patch_chars == len(big)
    assert len(outcome.patch) <= 16_000 and outcome.patch.endswith("\n") and big.startswith(outcome.patch)
    assert json.loads(outcome.model_dump_json())["base_commit"] == "a" * 40
