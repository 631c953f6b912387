"""The prompt's view of a workspace: `domain.workspace.workspace_view` with the contents of its
smaller text files read from the read-only checkout (Python first, tests after the code)."""

from __future__ import annotations

from pathlib import Path

from ..domain.workspace import Workspace, is_test_path, workspace_view

MAX_SHOWN_FILE_BYTES = 4_000


def prompt_view(workspace: Workspace, max_chars: int = 8_000) -> str:
    root = Path(workspace.path)
    wanted = sorted(
        (
            f
            for f in workspace.files
            if f.size <= MAX_SHOWN_FILE_BYTES and f.language in ("python", "toml", "text")
        ),
        key=lambda f: (f.language != "python", is_test_path(f.path), f.path),
    )
    contents = {}
    for entry in wanted:
        path = root / entry.path
        if path.is_file() and not path.is_symlink():
            contents[entry.path] = path.read_text(errors="replace")
    return workspace_view(workspace, contents, max_chars)
