"""Deliberation assets invoked directly, as Dagster allows: a context from `dg.build_asset_context`,
the upstream values and the resources as arguments. No job, no instance, no server."""

from __future__ import annotations

import dagster as dg
import pytest

from fleet_pipelines.assets.deliberation import (
    DeliberationConfig,
    convened_council,
    decision,
    deliberation_task,
)
from fleet_pipelines.domain.context import StoryContext
from fleet_pipelines.domain.councils import Convened
from fleet_pipelines.domain.decision import Decision
from fleet_pipelines.domain.limits import SandboxLimits
from fleet_pipelines.domain.models import DeliberationStatus, Role, Task, TurnStatus
from fleet_pipelines.domain.scoring import ProposalScore
from fleet_pipelines.domain.workspace import Workspace
from fleet_pipelines.resources.config import SandboxLimitsConfig
from fleet_pipelines.resources.council import CouncilResource
from tests.factories import turn

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
