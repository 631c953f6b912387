"""The README's Quick start and the blocks marked for it, run exactly as written, as a new user
would: `make dev` in one process, each block in a second one with a clean environment (`env -i`);
on the same stack a launchpad run as from the UI, then Ctrl-C stops every part of it (the dev
stack's own test, which started a second stack for this, is folded in here).

All of it runs in a private network namespace (first_hour.py), so `make dev` takes its default ports
and port 4222 is under the test's control: a decoy NATS server listens there, which must see no
connection and no stream (so the blocks would run the same with nothing on 4222). The machine's own
NATS on 4222 cannot be the decoy: its traffic from other clients could not be told apart, and it has
no monitoring port.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_pipelines.cli import REPO_ROOT

from .first_hour import LAUNCHPAD_MAX_TOKENS

README = REPO_ROOT / "README.md"
BLOCK = re.compile(r"<!-- first-hour(?:: (?P<kind>\w+))? -->\n```(?:bash|text)\n(?P<body>.*?)```", re.S)
PROPOSAL = "--- winning proposal ---"


def marked_blocks() -> tuple[str, list[tuple[str, str | None]]]:
    """The stack's command, and each block to run with the sample output the README shows for it."""
    stack, blocks = None, []
    for match in BLOCK.finditer(README.read_text()):
        kind, body = match["kind"], match["body"]
        if kind == "stack":
            stack = body.strip()
        elif kind == "output":
            command, _ = blocks[-1]
            blocks[-1] = (command, body)
        else:
            blocks.append((body.strip(), None))
    assert stack is not None and blocks
    return stack, blocks


def line_pattern(sample: str) -> str:
    """A sample line as a pattern: numbers stand for any number, `…` for anything on the line, and
    a line of `…` alone for any number of lines."""
    if sample.strip() == "…":
        return r"(?:[^\n]*\n)*?"
    escaped = re.escape(sample.rstrip())
    escaped = re.sub(r"\d+(?:\\\.\d+)?", r"\\d+(?:\\.\\d+)?", escaped)
    return escaped.replace("…", "[^\n]*") + "\n"


def assert_shape(output: str, sample: str) -> None:
    """The output is the sample, line for line (up to the winning proposal, whose text varies)."""
    shown = [line for line in sample.splitlines() if line.strip()]
    got = [line for line in output.splitlines() if line.strip()]
    if PROPOSAL in shown:
        shown, got = shown[: shown.index(PROPOSAL) + 1], got[: got.index(PROPOSAL) + 1]
    pattern = "".join(line_pattern(line) for line in shown)
    assert re.fullmatch(pattern, "".join(f"{line}\n" for line in got)), (
        f"the output is not what the README shows:\n{output}\n--- README ---\n{sample}"
    )


def namespace_argv() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed: no private network namespace")
    return [unshare, "--net"] if os.geteuid() == 0 else [unshare, "--user", "--map-root-user", "--net"]


@pytest.mark.heavy(300)
# The whole README on `make dev`'s defaults: 6 min beside another worker, 9-10 min when a burst of
# sandbox runs shares the machine.
@pytest.mark.timeout(1500)
def test_quick_start_and_nats_blocks_run_as_written_and_never_touch_4222(tmp_path: Path):
    stack, blocks = marked_blocks()
    assert stack == "make dev"
    driver = [sys.executable, "-m", "tests.integration.first_hour", str(tmp_path / "project")]
    done = subprocess.run(
        [*namespace_argv(), *driver, json.dumps([command for command, _ in blocks])],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    report = json.loads(done.stdout.splitlines()[-1])
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2))  # every block's output
    assert report["4222_free"], "port 4222 was not free in the private namespace"
    for name, runs in report["passes"].items():
        for run, (_, sample) in zip(runs, blocks, strict=True):
            assert run["rc"] == 0, f"{name}: {run['block']}\n{run['stdout']}\n{run['stderr']}"
            if sample is not None:
                assert_shape(run["stdout"], sample)
    # The server on 4222 that nobody chose saw nothing: no connection, no message, no stream.
    assert report["decoy"] == {"total_connections": 0, "in_msgs": 0, "streams": 0, "messages": 0}
    # The same stack, as the UI's launchpad uses it: the run carries its engine's tag (the run
    # queue counts it against its engine) and its council's proposals.
    ui = report["launchpad_run"]
    assert ui["status"] == "SUCCESS" and ui["engine_tag"] == ui["engine"], ui
    assert "agent-dev-002" in ui["proposals_preview"]
    assert len(ui["proposal_tokens"]) == 2 and max(ui["proposal_tokens"]) <= LAUNCHPAD_MAX_TOKENS, ui
    # Ctrl-C stopped every part of it (the runs' processes included) and forgot it: a command
    # there now says how to start one, in one line.
    assert report["processes_left"] == [] and report["ports_open"] == []
    assert not report["stack_record_left"], "Ctrl-C left .fleet/stack.json behind"
    after = report["after_stop"]
    assert after["rc"] == 1
    assert (
        after["stderr"]
        == "fleet deliberate: no NATS server chosen: start the local stack (make dev) or set NATS_URL\n"
    )


def test_the_readme_lists_the_engine_fields_that_exist():
    from fleet_pipelines.resources.config import OpenAIEngineConfig

    listed = re.search(r"<!-- engine.openai -->(.*?)<!-- /engine.openai -->", README.read_text(), re.S)
    assert listed is not None
    assert re.findall(r"`(\w+)`", listed[1]) == list(OpenAIEngineConfig.model_fields)
