"""The prompt's view of a workspace: `domain.workspace.workspace_view` with the repository map
(`domain.repomap`) of the read-only checkout, ranked by the task and the failing tests and capped
at a token budget; and the texts agents read and a proposal's edits are checked against
(`domain.edits`), without what no one edits (`repomap.indexed`)."""

from __future__ import annotations

from pathlib import Path

from ..domain.repomap import Count, approx_tokens, indexed, repo_map
from ..domain.workspace import Workspace, is_test_path, workspace_view

MAX_EDIT_FILE_BYTES = 200_000
MAX_EDIT_FILES = 400
MAP_TOKENS = 1_200  # the repository map's share of the first prompt


def _read(root: Path, path: str) -> str | None:
    """A regular file of the checkout as text; None for a link, a folder or a binary file."""
    file = root / path
    if not file.is_file() or file.is_symlink():
        return None
    data = file.read_bytes()
    if b"\0" in data[:8_192]:
        return None
    return data.decode(errors="replace")


def prompt_view(
    workspace: Workspace, description: str = "", max_tokens: int = MAP_TOKENS, count: Count = approx_tokens
) -> str:
    """The workspace as the first prompt shows it, its map ranked by `description` (the task) and
    the baseline's failing tests, within `max_tokens` as `count` measures them."""
    base = workspace.baseline
    texts = edit_files(workspace)
    repository_map = repo_map(
        texts,
        [f.path for f in workspace.files],
        description,
        base.failing if base else [],
        base.first_failure if base else "",
        max_tokens,
        count,
        base.executed if base else None,
    )
    return workspace_view(workspace, repository_map)


def edit_files(workspace: Workspace) -> dict[str, str]:
    """The texts agents read and edits may change (path -> text): the checkout's indexed text
    files up to MAX_EDIT_FILE_BYTES each, code before tests, at most MAX_EDIT_FILES; none without
    a workspace."""
    if not workspace.active:
        return {}
    root = Path(workspace.path)
    entries = sorted(
        (
            f
            for f in workspace.files
            if f.size <= MAX_EDIT_FILE_BYTES and f.language != "other" and indexed(f.path)
        ),
        key=lambda f: (f.language != "python", is_test_path(f.path), f.path),
    )
    texts = {}
    for entry in entries[:MAX_EDIT_FILES]:
        text = _read(root, entry.path)
        if text is not None:
            texts[entry.path] = text
    return texts
