"""Pushes a winning patch as branch `fleet/{task_id}` to a configured remote.

The commit is built without a working tree: the base commit is fetched into a fresh git
directory (the checkout's git environment: no host configuration, no hooks), the patch is applied
to the index only (`git apply --cached`: nothing of it is written to the file system), and the
tree is committed on top of the base and pushed. The token of a private remote comes from the
environment, as for the checkout.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from .checkout import CheckoutError, fetch_commit, git_env, normalize_url, run_git

AUTHOR = ("fleet", "fleet@example.invalid")


def branch_name(task_id: str) -> str:
    return f"fleet/{task_id}"


def push_patch(
    url: str, commit: str, patch: str, remote: str, task_id: str, message: str, token: str = ""
) -> str:
    """Commits `patch` on `commit` of `url` and pushes it to `remote` as `fleet/{task_id}`
    (forced: a re-run replaces it). Returns the pushed commit."""
    if not patch.strip():
        raise CheckoutError("no patch to push")
    with tempfile.TemporaryDirectory(prefix="fleet-push-") as scratch:
        git_dir = Path(scratch) / "git"
        home = Path(scratch) / "home"
        home.mkdir()
        env = git_env(str(home), token)
        env.update(
            GIT_AUTHOR_NAME=AUTHOR[0],
            GIT_AUTHOR_EMAIL=AUTHOR[1],
            GIT_COMMITTER_NAME=AUTHOR[0],
            GIT_COMMITTER_EMAIL=AUTHOR[1],
            GIT_INDEX_FILE=str(Path(scratch) / "index"),
        )
        run_git(git_dir, env, "init", "--bare", "--quiet", "--template=")
        base = fetch_commit(
            git_dir, env, normalize_url(url), commit, shallow=False
        )  # a remote takes no shallow history
        run_git(git_dir, env, "read-tree", base)
        patch_file = Path(scratch) / "winner.patch"
        patch_file.write_text(patch)
        run_git(git_dir, env, "apply", "--cached", str(patch_file))
        tree = run_git(git_dir, env, "write-tree").decode().strip()
        new = run_git(git_dir, env, "commit-tree", tree, "-p", base, "-m", message).decode().strip()
        target = normalize_url(remote)
        run_git(
            git_dir,
            env,
            "push",
            "--force",
            "--quiet",
            "--",
            target,
            f"{new}:refs/heads/{branch_name(task_id)}",
        )
        return new


def remote_branch_commit(remote: str, task_id: str) -> str | None:
    """The commit `fleet/{task_id}` points at on `remote` (None: no such branch)."""
    with tempfile.TemporaryDirectory(prefix="fleet-ls-") as home:
        done = subprocess.run(
            ["git", "ls-remote", "--", normalize_url(remote), f"refs/heads/{branch_name(task_id)}"],
            capture_output=True,
            text=True,
            env=git_env(home),
            timeout=60,
            check=False,
        )
    if done.returncode != 0:
        raise CheckoutError(f"git ls-remote failed: {done.stderr.strip()[-300:]}")
    line = done.stdout.strip()
    return line.split()[0] if line else None
