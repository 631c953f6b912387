"""Every deliberation asset invoked directly, as Dagster allows: a context from
`dg.build_asset_context`, the upstream values and the resources as arguments. No job; the steps
that publish or read events use the session's real nats-server, agents' turns the scripted runner."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from fleet_pipelines.assets.deliberation import (
    DeliberationConfig,
    convened_council,
    decision,
    decision_events,
    deliberation_task,
    proposals,
    reviews,
    scores,
    winning_branch,
)
from fleet_pipelines.assets.story import story_context
from fleet_pipelines.assets.workspace import workspace as workspace_asset
from fleet_pipelines.domain.context import StoryContext
from fleet_pipelines.domain.councils import Convened
from fleet_pipelines.domain.decision import Decision
from fleet_pipelines.domain.limits import SandboxLimits
from fleet_pipelines.domain.models import DeliberationStatus, RepoSpec, Role, Task, TurnStatus
from fleet_pipelines.domain.scoring import ProposalScore
from fleet_pipelines.domain.workspace import PushedBranch, Workspace
from fleet_pipelines.events.context import context_subject
from fleet_pipelines.events.models import EventEnvelope
from fleet_pipelines.events.streams import (
    AGENT_RESPONSE_COMPLETED,
    AGENT_RESPONSE_FAILED,
    CONTEXT_UPDATED,
    DELIBERATION_COMPLETED,
)
from fleet_pipelines.names import TAG_CAUSATION, TAG_CORRELATION
from fleet_pipelines.resources.config import SandboxLimitsConfig
from fleet_pipelines.resources.council import CouncilResource
from fleet_pipelines.resources.events import NatsResource
from fleet_pipelines.resources.repos import ReposResource
from tests.factories import read_subject, turn
from tests.scripted import ScriptedTurnRunner

TASK_ID = "direct-1"
NO_WORKSPACE = Workspace(task_id=TASK_ID)  # a task that names no repository


def context() -> dg.AssetExecutionContext:
    return dg.build_asset_context(partition_key=TASK_ID)


def test_deliberation_task_validates_its_config_into_the_partitions_task():
    output = deliberation_task(context(), DeliberationConfig(description="Write add(a, b).", num_agents=2))
    task = output.value
    assert isinstance(task, Task) and task.task_id == TASK_ID and task.role is Role.DEV
    assert task.num_agents == 2 and task.description == "Write add(a, b)."
    assert output.metadata["role"] == dg.MetadataValue.text("DEV")
    assert output.metadata["num_agents"] == dg.MetadataValue.int(2)


def test_deliberation_task_with_an_invalid_config_fails_naming_the_field():
    with pytest.raises(dg.Failure, match=f"invalid deliberation task '{TASK_ID}': num_agents") as failed:
        deliberation_task(context(), DeliberationConfig(description="d", num_agents=11))
    assert failed.value.allow_retries is False


def test_council_is_convened_from_the_resource_with_its_sandbox_limits_and_quorum():
    task = Task(task_id=TASK_ID, description="d", role=Role.DEV, num_agents=3)
    story = StoryContext(story_id="US-1")
    resource = CouncilResource(quorum=3, sandbox=SandboxLimitsConfig(wall_s=4, memory_mb=256))
    output = convened_council(
        context(), deliberation_task=task, story_context=story, workspace=NO_WORKSPACE, council=resource
    )
    convened = output.value
    assert isinstance(convened, Convened) and convened.task.context == story
    assert convened.quorum == 3 and convened.sandbox == SandboxLimits(wall_s=4, memory_mb=256)
    shown = output.metadata["council"].data
    assert shown["quorum"] == 3 and shown["sandbox"]["wall_s"] == 4
    assert output.metadata["councils_file"] == dg.MetadataValue.text("none (built-in councils)")


def test_council_with_an_unreadable_councils_file_fails_naming_the_file(tmp_path):
    missing = tmp_path / "councils.yaml"
    task = Task(task_id=TASK_ID, description="d", role=Role.DEV)
    with pytest.raises(dg.Failure, match=r"councils\.yaml: cannot be read"):
        convened_council(
            context(),
            deliberation_task=task,
            story_context=StoryContext(),
            workspace=NO_WORKSPACE,
            council=CouncilResource(councils_file=str(missing)),
        )


def decide_two_of_three(quorum: int | None) -> tuple[Decision, dict[str, dg.AssetCheckResult]]:
    """`decision` on a council of three where two agents delivered (the third failed)."""
    task = Task(task_id=TASK_ID, description="d", role=Role.DEV, num_agents=3)
    convened = CouncilResource(quorum=quorum).convene(task)
    ids = [a.agent_id for a in convened.agents]
    proposals = [
        turn(ids[0], "first", task_id=TASK_ID),
        turn(ids[1], "second", task_id=TASK_ID),
        turn(ids[2], "", task_id=TASK_ID, status=TurnStatus.FAILED),
    ]
    scores = [
        ProposalScore(agent_id=agent, score=score, checks=[], requirements=[], code_blocks=0)
        for agent, score in zip(ids, (0.4, 0.6), strict=False)
    ]
    output, *checks = decision(
        convened=convened, workspace=NO_WORKSPACE, proposals=proposals, reviews=[], scores=scores
    )
    assert isinstance(output, dg.Output) and all(isinstance(c, dg.AssetCheckResult) for c in checks)
    return output.value, {c.check_name: c for c in checks}


def test_decision_with_the_default_quorum_passes_quorum_met():
    decided, checks = decide_two_of_three(quorum=None)  # a majority of three: two
    assert decided.status is DeliberationStatus.PARTIAL and decided.quorum == 2
    assert decided.winner_id == "agent-dev-002"
    assert set(checks) == {"quorum_met", "winner_passes_checks"}
    assert checks["quorum_met"].passed
    assert checks["quorum_met"].description == "2 agents with a final proposal, quorum 2"


def test_decision_reads_the_quorum_of_the_convened_council_and_fails_quorum_met():
    decided, checks = decide_two_of_three(quorum=3)
    assert decided.status is DeliberationStatus.FAILED and decided.quorum == 3
    assert not checks["quorum_met"].passed
    assert checks["quorum_met"].severity is dg.AssetCheckSeverity.ERROR


# The steps that take the turn runner, NATS or the repositories: the scripted turn runner
# (tests/scripted.py) in place of Ray and an engine, the session's real nats-server, and a context
# with run tags as a sensor's run has them (correlation and causation of the planning event).
ADD = "def add(a, b):\n    return a + b"
SUB = "def add(a, b):\n    return a - b"
NEGATIVE = "def test_negative():\n    assert add(-1, -1) == -2\n"
TAGS = {TAG_CORRELATION: "corr-direct", TAG_CAUSATION: "cause-direct"}


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


def run_context(instance: dg.DagsterInstance, task_id: str) -> dg.AssetExecutionContext:
    return dg.build_asset_context(partition_key=task_id, instance=instance, run_tags=TAGS)


def convene(task_id: str, **fields) -> Convened:
    task = Task.from_fields(task_id, {"description": "Write add(a, b).", "role": "DEV", **fields})
    return CouncilResource().convene(task)


def events(nats: NatsResource, stream: str, subject: str, task_id: str) -> list[dict]:
    """The events of `task_id` on `subject` (the session's server holds other tests' too)."""
    return [e for e in read_subject(nats, stream, subject) if e["payload"]["task_id"] == task_id]


def test_story_context_reads_the_storys_context_events_from_nats(instance, nats_server: str):
    story = f"US-direct-{uuid.uuid4().hex[:8]}"
    nats = NatsResource(url=nats_server)
    update = {"story_id": story, "summary": "Amounts are integers in cents.", "source": "ctx-svc"}
    envelope = EventEnvelope(
        event_type=CONTEXT_UPDATED, idempotency_key=f"ctx-{story}", correlation_id=story, payload=update
    )
    nats.publish([(context_subject(story), envelope)])
    task = Task(
        task_id="story-1", description="d", role=Role.DEV, story_id=story, story_title="Money arithmetic"
    )
    output = story_context(run_context(instance, "story-1"), deliberation_task=task, nats=nats)
    built = output.value
    assert built.story_id == story
    assert [e.kind for e in built.entries] == ["story", "update"]
    shown = built.render()
    assert "Title: Money arithmetic" in shown and "from ctx-svc) Amounts are integers in cents." in shown
    assert output.metadata["context_events"] == dg.MetadataValue.text("1 read")


def test_story_context_of_a_task_without_a_story_is_empty_and_asks_nats_nothing(instance):
    unreachable = NatsResource(url="nats://127.0.0.1:1")  # asked nothing: never connected
    task = Task(task_id="story-2", description="d", role=Role.DEV)
    output = story_context(run_context(instance, "story-2"), deliberation_task=task, nats=unreachable)
    assert output.value.entries == [] and output.value.render() == ""


def test_workspace_of_a_task_without_a_repository_is_empty():
    task = Task(task_id=TASK_ID, description="d", role=Role.DEV)
    output = workspace_asset(context(), deliberation_task=task, repos=ReposResource())
    assert output.value == NO_WORKSPACE and not output.value.active
    assert output.metadata["repository"] == dg.MetadataValue.text("none (not a repository task)")


def test_workspace_of_a_repository_that_is_not_there_fails_naming_the_task(tmp_path: Path):
    task = Task(
        task_id=TASK_ID, description="d", role=Role.DEV, repo=RepoSpec(url=str(tmp_path / "no-such-repo"))
    )
    with pytest.raises(dg.Failure, match=f"workspace of {TASK_ID}: ") as failed:
        workspace_asset(context(), deliberation_task=task, repos=ReposResource(root=str(tmp_path / "ws")))
    assert failed.value.allow_retries is False


def test_proposals_one_per_agent_each_told_on_nats_as_it_ends(instance, nats_server: str, tmp_path: Path):
    convened = convene("direct-prop-1", num_agents=2)
    nats = NatsResource(url=nats_server, outbox_path=str(tmp_path / "outbox"))
    runner = ScriptedTurnRunner(code=ADD, fail_agents=["agent-dev-002"])
    output = proposals(
        run_context(instance, "direct-prop-1"),
        convened=convened,
        workspace=Workspace(task_id="direct-prop-1"),
        repos=ReposResource(),
        turn_runner=runner,
        nats=nats,
    )
    assert [(r.agent_id, r.status) for r in output.value] == [
        ("agent-dev-001", TurnStatus.COMPLETED),
        ("agent-dev-002", TurnStatus.FAILED),
    ]
    assert ADD in output.value[0].content and output.metadata["usable"] == dg.MetadataValue.int(1)
    [done] = events(nats, "AGENT_RESPONSES", AGENT_RESPONSE_COMPLETED, "direct-prop-1")
    [failed] = events(nats, "AGENT_RESPONSES", AGENT_RESPONSE_FAILED, "direct-prop-1")
    assert done["payload"]["agent_id"] == "agent-dev-001" and failed["payload"]["agent_id"] == "agent-dev-002"
    assert done["correlation_id"] == "corr-direct"  # the run's tags reach its events


def test_reviews_critique_peers_and_revise_with_their_code_checked(
    instance, nats_server: str, tmp_path: Path
):
    convened = convene("direct-rev-1", num_agents=2, rounds=1, tests=NEGATIVE)
    task, agents = convened.task, convened.agents
    first = [turn(a.agent_id, f"```python\n{SUB}\n```", task_id=task.task_id) for a in agents]
    output = reviews(
        run_context(instance, "direct-rev-1"),
        convened=convened,
        workspace=Workspace(task_id=task.task_id),
        proposals=first,
        repos=ReposResource(),
        turn_runner=ScriptedTurnRunner(code=SUB),
        nats=NatsResource(url=nats_server, outbox_path=str(tmp_path / "outbox")),
    )
    kinds = sorted((r.agent_id, r.kind.value) for r in output.value)
    assert kinds == [
        ("agent-dev-001", "critique"),
        ("agent-dev-001", "revise"),
        ("agent-dev-002", "critique"),
        ("agent-dev-002", "revise"),
    ]
    assert all(r.round == 1 for r in output.value)
    assert output.metadata["rounds"] == dg.MetadataValue.int(1)
    shown = output.metadata["feedback_shown"].value  # each author saw its own code's test results
    assert "version of round 0" in shown and "FAIL test_negative" in shown


def test_scores_run_the_checks_and_ask_the_judge_for_each_final(instance, nats_server: str, tmp_path: Path):
    convened = convene("direct-score-1", num_agents=2, tests=NEGATIVE)
    finals = [
        turn(a.agent_id, f"```python\n{code}\n```", task_id="direct-score-1")
        for a, code in zip(convened.agents, (ADD, SUB), strict=True)
    ]
    output = scores(
        run_context(instance, "direct-score-1"),
        convened=convened,
        workspace=Workspace(task_id="direct-score-1"),
        proposals=finals,
        reviews=[],
        repos=ReposResource(),
        turn_runner=ScriptedTurnRunner(judge_score=6),
        nats=NatsResource(url=nats_server, outbox_path=str(tmp_path / "outbox")),
    )
    by_agent = {s.agent_id: s for s in output.value}
    assert [s.agent_id for s in output.value] == ["agent-dev-001", "agent-dev-002"]
    assert by_agent["agent-dev-001"].value("tests") == 1.0
    assert by_agent["agent-dev-002"].value("tests") == 0.0
    assert all(s.value("code_parses") == 1.0 and s.value("judge") == 0.6 for s in output.value)
    assert by_agent["agent-dev-001"].score > by_agent["agent-dev-002"].score


def test_winning_branch_of_a_task_without_a_repository_pushes_nothing():
    decided, _ = decide_two_of_three(quorum=None)
    convened = CouncilResource().convene(Task(task_id=TASK_ID, description="d", role=Role.DEV, num_agents=3))
    output = winning_branch(
        context(), convened=convened, workspace=NO_WORKSPACE, decision=decided, repos=ReposResource()
    )
    assert output.value == PushedBranch()
    assert output.metadata["pushed_branch"] == dg.MetadataValue.text("not pushed")


def test_decision_events_tell_the_outcome_on_nats_with_the_runs_correlation(
    instance, nats_server: str, tmp_path: Path
):
    decided, _ = decide_two_of_three(quorum=None)  # agent-dev-002 wins, PARTIAL
    convened = CouncilResource().convene(Task(task_id=TASK_ID, description="d", role=Role.DEV, num_agents=3))
    proposed = [turn(a.agent_id, "p", task_id=TASK_ID) for a in convened.agents]
    nats = NatsResource(url=nats_server, outbox_path=str(tmp_path / "outbox"))
    result = decision_events(
        run_context(instance, TASK_ID),
        convened=convened,
        proposals=proposed,
        decision=decided,
        winning_branch=PushedBranch(),
        nats=nats,
    )
    assert isinstance(result, dg.MaterializeResult)
    [told] = events(nats, "ORCHESTRATOR_EVENTS", DELIBERATION_COMPLETED, TASK_ID)
    assert told["payload"]["winner_id"] == "agent-dev-002" and told["payload"]["status"] == "PARTIAL"
    assert (told["correlation_id"], told["causation_id"]) == ("corr-direct", "cause-direct")
