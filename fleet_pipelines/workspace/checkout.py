"""A safe checkout of a repository that may be hostile.

The commit is fetched into a fresh, empty git directory (no template: no hooks), with the host's
git configuration ignored (`GIT_CONFIG_NOSYSTEM`, `GIT_CONFIG_GLOBAL=/dev/null`), hooks pointed at
/dev/null and only the usual transports allowed. The tree is then written by this module from
`git ls-tree` and `git cat-file` output, never by `git checkout`: no smudge/clean filter, LFS
or hook ever runs, `.gitattributes` is just a file. On the way:
- every path is checked (relative, no `..`, no `.git` segment);
- symlinks are written last, and only where their target stays inside the workspace, checked
  lexically and after writing (`realpath`); others are left out and listed;
- submodules are left out and listed unless the task asks for them (then each is checked out
  the same way, from its URL in `.gitmodules`, at the commit the tree records);
- files over `max_file_bytes` are left out and listed, a tree over `max_repo_bytes` or
  `max_files` is refused;
- the result is read-only (files 0444/0555, folders 0555).

A token for a private https remote comes from the environment (the caller passes it) and reaches
git as an `http.extraHeader` in git's environment, never in an argument or a stored value.
"""

from __future__ import annotations

import base64
import os
import posixpath
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..domain.workspace import MAX_INDEX_ENTRIES, FileEntry, language_of

_ALLOWED_PROTOCOLS = ("file", "https", "http", "ssh", "git")
_HEX = re.compile(r"^[0-9a-f]{7,40}$")
GIT_TIMEOUT_S = 300


class CheckoutError(RuntimeError):
    """The repository could not be checked out (bad URL or ref, over a cap, git failed)."""


@dataclass(frozen=True)
class CheckoutLimits:
    max_file_bytes: int = 1024 * 1024
    max_repo_bytes: int = 100 * 1024 * 1024
    max_files: int = 20_000


@dataclass
class Checkout:
    commit: str
    files: list[FileEntry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    total_bytes: int = 0

    @property
    def index(self) -> list[FileEntry]:
        return self.files[:MAX_INDEX_ENTRIES]


def git_env(home: str, token: str = "") -> dict[str, str]:
    """git's whole environment: nothing of the host's git configuration, no prompt, hooks off,
    only the allowed transports; with `token`, an Authorization header for https remotes."""
    config = [
        ("core.hooksPath", os.devnull),
        ("core.fsmonitor", "false"),
        ("transfer.fsckObjects", "true"),
        ("protocol.allow", "never"),
        *((f"protocol.{p}.allow", "always") for p in _ALLOWED_PROTOCOLS),
    ]
    if token:
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        config.append(("http.extraHeader", f"Authorization: Basic {basic}"))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "LANG": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "",
        "SSH_ASKPASS": "",
        "GIT_LFS_SKIP_SMUDGE": "1",
        "GIT_CONFIG_COUNT": str(len(config)),
    }
    for i, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def run_git(git_dir: Path, env: dict[str, str], *args: str, stdin: bytes | None = None) -> bytes:
    argv = ["git", "--git-dir", str(git_dir), *args]
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise CheckoutError(f"git {args[0]} took over {GIT_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        raise CheckoutError(f"git {args[0]} failed: {done.stderr.decode(errors='replace').strip()[-500:]}")
    return done.stdout


def normalize_url(url: str, base: str | None = None) -> str:
    """An absolute local path for a path (relative to `base` for `./` and `../`), the URL else."""
    if "://" in url or re.match(r"^[\w.-]+@[\w.-]+:", url):
        return url
    if base is not None and url.startswith(("./", "../")):
        if "://" in base:
            return posixpath.normpath(posixpath.join(base, url)).replace(":/", "://", 1)
        return os.path.normpath(os.path.join(base, url))
    return os.path.abspath(url)


def fetch_commit(git_dir: Path, env: dict[str, str], url: str, ref: str, shallow: bool = True) -> str:
    """Fetches `ref` of `url` into `git_dir` (only its last commit when `shallow`) and returns the
    commit it resolves to."""
    if url.startswith("-"):
        raise CheckoutError(f"not a repository URL: {url!r}")
    try:
        run_git(git_dir, env, "fetch", "--no-tags", *(["--depth", "1"] if shallow else []), "--", url, ref)
    except CheckoutError:
        if not _HEX.match(ref):
            raise
        # a commit id the remote does not serve by id: fetch its branches and tags, look it up
        run_git(git_dir, env, "fetch", "--tags", "--", url, "+refs/heads/*:refs/remotes/origin/*")
        return run_git(git_dir, env, "rev-parse", "--verify", f"{ref}^{{commit}}").decode().strip()
    return run_git(git_dir, env, "rev-parse", "--verify", "FETCH_HEAD^{commit}").decode().strip()


def _safe_path(path: str) -> bool:
    parts = path.split("/")
    return (
        bool(path)
        and not path.startswith("/")
        and all(p not in ("", ".", "..") for p in parts)
        and not any(p.lower() == ".git" for p in parts)
    )


def _symlink_inside(path: str, target: str) -> bool:
    if target.startswith("/") or not target:
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return resolved != ".." and not resolved.startswith("../")


def _tree(git_dir: Path, env: dict[str, str], commit: str) -> list[tuple[str, str, str, int]]:
    """(mode, object, path, size) of every entry of the commit's tree."""
    out = run_git(git_dir, env, "ls-tree", "-r", "-l", "-z", "--full-tree", commit)
    entries = []
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, _kind, obj, size = meta.decode().split()
        entries.append((mode, obj, path.decode(errors="surrogateescape"), int(size) if size != "-" else 0))
    return entries


def _read_blobs(git_dir: Path, env: dict[str, str], objects: list[str]) -> dict[str, bytes]:
    if not objects:
        return {}
    out = run_git(git_dir, env, "cat-file", "--batch", stdin="".join(f"{o}\n" for o in objects).encode())
    blobs: dict[str, bytes] = {}
    position = 0
    for obj in objects:
        end = out.index(b"\n", position)
        header = out[position:end].decode().split()
        size = int(header[2])
        blobs[obj] = out[end + 1 : end + 1 + size]
        position = end + 1 + size + 1
    return blobs


def _write_tree(
    git_dir: Path,
    env: dict[str, str],
    commit: str,
    target: Path,
    limits: CheckoutLimits,
    result: Checkout,
    prefix: str,
    url: str,
    submodules: bool,
) -> None:
    entries = _tree(git_dir, env, commit)
    files = [e for e in entries if e[0] in ("100644", "100755")]
    links = [e for e in entries if e[0] == "120000"]
    gitlinks = [e for e in entries if e[0] == "160000"]
    if len(result.files) + len(files) > limits.max_files:
        raise CheckoutError(f"the repository has over {limits.max_files} files (max_files)")
    wanted = []
    for mode, obj, path, size in files:
        shown = prefix + path
        if not _safe_path(path):
            result.skipped.append(f"{shown}: unsafe path")
        elif size > limits.max_file_bytes:
            result.skipped.append(f"{shown}: {size} bytes, over max_file_bytes {limits.max_file_bytes}")
        else:
            wanted.append((mode, obj, path, size))
    total = result.total_bytes + sum(e[3] for e in wanted)
    if total > limits.max_repo_bytes:
        raise CheckoutError(
            f"the repository's files take over {limits.max_repo_bytes} bytes (max_repo_bytes)"
        )
    result.total_bytes = total
    blobs = _read_blobs(git_dir, env, sorted({e[1] for e in wanted} | {e[1] for e in links}))
    for mode, obj, path, size in wanted:
        destination = target / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(blobs[obj])
        os.chmod(destination, 0o555 if mode == "100755" else 0o444)
        result.files.append(FileEntry(path=prefix + path, size=size, language=language_of(path)))
    for _mode, gitlink, path, _size in gitlinks:
        if not submodules:
            result.skipped.append(f"{prefix + path}: submodule at {gitlink[:12]} (submodules not asked for)")
            continue
        sub_url = _submodule_url(git_dir, env, commit, path)
        if sub_url is None or not _safe_path(path):
            result.skipped.append(f"{prefix + path}: submodule without a URL in .gitmodules")
            continue
        sub_git = Path(tempfile.mkdtemp(prefix="fleet-submodule-"))
        try:
            run_git(sub_git, env, "init", "--bare", "--quiet", "--template=")
            fetched = fetch_commit(sub_git, env, normalize_url(sub_url, url), gitlink)
            (target / path).mkdir(parents=True, exist_ok=True)
            _write_tree(
                sub_git, env, fetched, target / path, limits, result, f"{prefix}{path}/", sub_url, True
            )
        finally:
            shutil.rmtree(sub_git, ignore_errors=True)
    for _mode, obj, path, _size in links:  # last: no file is written through a link
        link_target = blobs[obj].decode(errors="replace")
        if not _safe_path(path) or not _symlink_inside(path, link_target):
            result.skipped.append(f"{prefix + path}: symlink to {link_target!r} leaves the workspace")
            continue
        destination = target / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(link_target, destination)
        real = os.path.realpath(destination)
        if not (real == str(target) or real.startswith(str(target) + os.sep)):
            os.unlink(destination)
            result.skipped.append(
                f"{prefix + path}: symlink to {link_target!r} resolves outside the workspace"
            )


def _submodule_url(git_dir: Path, env: dict[str, str], commit: str, path: str) -> str | None:
    try:
        out = run_git(
            git_dir,
            env,
            "config",
            "--blob",
            f"{commit}:.gitmodules",
            "--null",
            "--get-regexp",
            r"^submodule\..*\.(path|url)$",
        )
    except CheckoutError:
        return None
    values: dict[str, dict[str, str]] = {}
    for record in out.decode(errors="replace").split("\0"):
        key, _, value = record.partition("\n")
        name, _, attribute = key.removeprefix("submodule.").rpartition(".")
        values.setdefault(name, {})[attribute] = value
    return next((v["url"] for v in values.values() if v.get("path") == path and v.get("url")), None)


def _read_only(root: Path) -> None:
    for directory, _dirs, _files in os.walk(root):
        os.chmod(directory, 0o555)
    os.chmod(root, 0o555)


def checkout(
    url: str,
    ref: str,
    target: Path,
    limits: CheckoutLimits = CheckoutLimits(),
    token: str = "",
    submodules: bool = False,
) -> Checkout:
    """The repository at `ref`, written read-only to `target` (which must not exist)."""
    url = normalize_url(url)
    target.mkdir(parents=True, exist_ok=False)
    os.chmod(target, 0o755)
    with tempfile.TemporaryDirectory(prefix="fleet-git-") as scratch:
        git_dir = Path(scratch) / "git"
        home = Path(scratch) / "home"
        home.mkdir()
        env = git_env(str(home), token)
        run_git(git_dir, env, "init", "--bare", "--quiet", "--template=")
        commit = fetch_commit(git_dir, env, url, ref)
        result = Checkout(commit=commit)
        _write_tree(git_dir, env, commit, target, limits, result, "", url, submodules)
    _read_only(target)
    return result


def make_writable(root: Path) -> None:
    """Lets the owner delete a read-only checkout (retention, a re-run of the partition)."""
    if not root.exists():
        return
    for directory, _dirs, _files in os.walk(root):
        os.chmod(directory, 0o755)
