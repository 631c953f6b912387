"""The prompt's view of a workspace: `domain.workspace.workspace_view` with the contents of its
smaller text files read from the read-only checkout (Python first, tests after the code); and the
texts a proposal's edits are checked against (`domain.edits`)."""

from __future__ import annotations

from pathlib import Path

from ..domain.workspace import Workspace, is_test_path, workspace_view

MAX_SHOWN_FILE_BYTES = 4_000
MAX_EDIT_FILE_BYTES = 200_000
MAX_EDIT_FILES = 400


def _read(root: Path, path: str) -> str | None:
    """A regular file of the checkout as text; None for a link, a folder or a binary file."""
    file = root / path
    if not file.is_file() or file.is_symlink():
        return None
    data = file.read_bytes()
    if b"\0" in data[:8_192]:
        return None
    return data.decode(errors="replace")


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
        text = _read(root, entry.path)
        if text is not None:
            contents[entry.path] = text
    return workspace_view(workspace, contents, max_chars)


def edit_files(workspace: Workspace) -> dict[str, str]:
    """The texts edits may change (path -> text): the checkout's text files up to
    MAX_EDIT_FILE_BYTES each, code before tests, at most MAX_EDIT_FILES; none without a workspace."""
    if not workspace.active:
        return {}
    root = Path(workspace.path)
    entries = sorted(
        (f for f in workspace.files if f.size <= MAX_EDIT_FILE_BYTES and f.language != "other"),
        key=lambda f: (f.language != "python", is_test_path(f.path), f.path),
    )
    texts = {}
    for entry in entries[:MAX_EDIT_FILES]:
        text = _read(root, entry.path)
        if text is not None:
            texts[entry.path] = text
    return texts
