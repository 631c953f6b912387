"""Tasks that name a repository: the one schema (domain Task) through plan events, the CLI and the
launchpad; proposals as patches; the file index's languages."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from fleet_pipelines.assets.deliberation import DeliberationConfig, build_task
from fleet_pipelines.cli import fleet
from fleet_pipelines.domain.models import RepoSpec, Task
from fleet_pipelines.domain.workspace import (
    bounded_patch,
    changed_paths,
    extract_patch,
    is_test_path,
    language_of,
    rationale_of,
)
from fleet_pipelines.events.planning import StreamMessage, plan_deliberations, single_task_plan
from fleet_pipelines.events.streams import PLAN_APPROVED, PLANNING_STREAM

DIFF = "--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"


def test_a_task_names_a_repository_with_defaults():
    task = Task.from_fields("t1", {"description": "fix it", "role": "DEV", "repo": {"url": "/srv/calc"}})
    assert task.repo == RepoSpec(url="/srv/calc", ref="HEAD", test_command="python -m pytest -q")
    assert Task.from_fields("t1", task.fields()) == task  # the flat form carries it


@pytest.mark.parametrize(
    ("repo", "message"),
    [
        ({"url": "https://user:tok@github.com/o/r.git"}, "must not carry credentials"),
        ({"url": "/srv/r", "subdir": "../up"}, "inside the repository"),
        ({"url": "/srv/r", "ref": "main; rm -rf /"}, "String should match pattern"),
        ({"url": "/srv/r", "token": "x"}, "Extra inputs are not permitted"),
        ({"url": ""}, "at least 1 character"),
    ],
)
def test_a_bad_repository_is_refused_naming_the_field(repo, message):
    with pytest.raises(ValidationError) as info:
        Task.from_fields("t1", {"description": "d", "role": "DEV", "repo": repo})
    assert message in str(info.value)
    assert "repo" in str(info.value)


def test_plan_events_carry_the_repository():
    fields = {"description": "fix it", "role": "DEV", "repo": {"url": "/srv/calc", "ref": "v1.2"}}
    envelope = single_task_plan("t-repo", fields, "s1", "p1", "me", "key-1")
    data = envelope.model_dump_json().encode()
    [planned] = plan_deliberations(
        StreamMessage(stream=PLANNING_STREAM, seq=1, subject=PLAN_APPROVED, data=data)
    )
    task = Task.from_fields(planned.task_id, planned.task_config)
    assert task.repo is not None and (task.repo.url, task.repo.ref) == ("/srv/calc", "v1.2")


def test_the_launchpad_config_takes_the_repository_as_nested_fields():
    config = DeliberationConfig(description="fix", repo={"url": "/srv/calc", "submodules": True})
    task = build_task("t1", config.model_dump())
    assert task.repo is not None and task.repo.submodules is True
    assert DeliberationConfig(description="no repo").repo is None


def test_cli_repo_options_need_repo_and_build_the_field(tmp_path):
    done = CliRunner().invoke(fleet, ["deliberate", "fix it", "--ref", "main"])
    assert done.exit_code == 2 and "--ref needs --repo" in done.output
    # valid: the task is built and checked; publishing then fails on the unreachable NATS (exit 1)
    done = CliRunner().invoke(
        fleet,
        ["deliberate", "fix it", "--repo", str(tmp_path), "--ref", "main", "--test-command", "pytest -x"],
        env={"NATS_URL": "nats://127.0.0.1:9"},
    )
    assert done.exit_code == 1, done.output
    bad = CliRunner().invoke(fleet, ["deliberate", "fix it", "--repo", "https://u:p@h/r.git"])
    assert bad.exit_code == 2 and "credentials" in bad.output


def test_a_proposal_is_a_diff_plus_its_rationale():
    text = f"The constant is wrong.\n\n```diff\n{DIFF}```\nThat is all."
    assert extract_patch(text) == DIFF
    assert rationale_of(text) == "The constant is wrong.\n\nThat is all."
    assert extract_patch("Here:\n" + DIFF.rstrip("\n")) == DIFF  # an unfenced diff, newline added
    assert extract_patch("```python\nx = 2\n```") == ""
    assert changed_paths(DIFF + "--- /dev/null\n+++ b/tests/test_new.py\n") == [
        "calc.py",
        "tests/test_new.py",
    ]
    assert is_test_path("tests/test_new.py") and not is_test_path("calc.py")


def test_an_event_carries_a_large_patch_cut_at_a_line_end():
    patch = "".join(f"+{i}\n" for i in range(10_000))
    inline, cut = bounded_patch(patch, 1_000)
    assert cut and inline.endswith("\n") and patch.startswith(inline) and len(inline) <= 1_000
    assert bounded_patch(DIFF) == (DIFF, False)


@pytest.mark.parametrize(
    ("path", "language"),
    [("a/b.py", "python"), ("README.md", "markdown"), ("Dockerfile", "dockerfile"), ("x.bin", "other")],
)
def test_the_file_index_names_languages(path, language):
    assert language_of(path) == language


def test_a_private_remotes_token_comes_from_the_environment_only(monkeypatch):
    from fleet_pipelines.resources.repos import ReposResource
    from fleet_pipelines.workspace.checkout import git_env

    monkeypatch.setenv("FLEET_GIT_TOKEN", "s3cret")
    assert ReposResource().token() == "s3cret"
    assert ReposResource(token_env="OTHER_TOKEN").token() == ""
    env = git_env("/nonexistent", "s3cret")
    header = next(env[k.replace("KEY", "VALUE")] for k, v in env.items() if v == "http.extraHeader")
    assert header.startswith("Authorization: Basic ") and "s3cret" not in header  # base64, in env only
    assert "token" not in RepoSpec.model_fields  # never part of a task or its run config
