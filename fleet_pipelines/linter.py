"""ruff, the linter of both lint checks: where this host's ruff is, and the rules they select.

`scoring.code` runs it on a proposal's extracted Python on the host; `workspace.runs` binds it
into a repository's sandbox, where the job runs it on the patch's changed files.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

RUFF_RULES = "E4,E7,E9,F"  # ruff's defaults: syntax, undefined names, unused imports, ...


def ruff_binary() -> str | None:
    beside = Path(sys.executable).with_name("ruff")
    return str(beside) if beside.exists() else shutil.which("ruff")
