"""Every verb `fleet` lists loads its command when asked for it (what a fresh interpreter loads
for `fleet --help` and other quick commands: tests/integration/test_cli_startup.py)."""

from __future__ import annotations

import click
import pytest

from fleet_pipelines.cli import VERBS, fleet


@pytest.mark.parametrize("verb", list(VERBS))
def test_each_verb_listed_loads_its_command(verb: str):
    command = fleet.get_command(click.Context(fleet), verb)
    assert isinstance(command, click.Command) and command.name == verb
