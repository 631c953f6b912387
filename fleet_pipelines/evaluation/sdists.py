"""Real projects from PyPI, pinned: an sdist is downloaded once from the package index's simple
page into `.cache/sdists/` (ignored) and its sha256 is checked on every use; `unpack_repo` makes
it a git repository with one commit (a one-line change put in when given), as `fleet run --repo`
checks one out. The judge's real suites (`real_suites`) and the agents' real-project tasks
(`project_tasks`) both take their projects from here.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .repo_suite import git_commit_all

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "sdists"
INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class PinnedSdist:
    """A release's source distribution and the sha256 it must have."""

    name: str
    version: str
    sha256: str


def fetch(sdist: PinnedSdist, cache: Path = CACHE) -> Path:
    """The sdist's archive in `cache`, downloaded once; its sha256 checked every time."""
    cache.mkdir(parents=True, exist_ok=True)
    project = re.sub(r"[-_.]+", "-", sdist.name).lower()
    prefix = f"{project}-{sdist.version}.tar"
    found = [p for p in cache.glob("*.tar.gz") if re.sub(r"[-_.]+", "-", p.name.lower()).startswith(prefix)]
    if not found:
        page = urllib.request.urlopen(f"{INDEX}/{project}/", timeout=60).read().decode()
        links = [u for u in re.findall(r'href="([^"#]+)', page) if u.endswith(f"-{sdist.version}.tar.gz")]
        if not links:
            raise ValueError(f"no sdist of {sdist.name} {sdist.version} on {INDEX}")
        target = cache / links[0].rsplit("/", 1)[1]
        partial = target.with_name(target.name + ".partial")
        with urllib.request.urlopen(links[0], timeout=120) as response:
            partial.write_bytes(response.read())
        partial.rename(target)
        found = [target]
    digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
    if digest != sdist.sha256:
        raise ValueError(f"{found[0].name}: sha256 {digest}, pinned {sdist.sha256}")
    return found[0]


def replace_line(text: str, old: str, new: str) -> str:
    """`text` with its one line equal to `old` replaced by `new` (a line found 0 or 2+ times: ValueError)."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.rstrip("\n") == old]
    if len(hits) != 1:
        raise ValueError(f"{old!r} is on {len(hits)} lines, not one")
    lines[hits[0]] = new + "\n"
    return "".join(lines)


def _inside(name: str) -> bool:
    parts = name.split("/")
    return not name.startswith("/") and ".." not in parts


def unpack_repo(
    archive: Path, path: Path, change: tuple[str, str, str] | None = None, message: str = "the sdist"
) -> Path:
    """The sdist's files (its top folder stripped) as a git repository at `path` (made here), one
    commit on `main`; `change` (file, line, new line) put in first."""
    path.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        top = members[0].name.split("/", 1)[0] + "/"
        kept = []
        for member in members:  # files and folders only, inside the top folder (no link, device, `..`)
            name = member.name[len(top) :]
            if member.name.startswith(top) and (member.isfile() or member.isdir()) and _inside(name):
                member.name, member.mode = name, member.mode & 0o755
                if name:
                    kept.append(member)
        # tarfile's `filter` came in 3.11.4; Debian 12's 3.11.2 has none, so the members are checked above
        tar.extractall(path, members=kept)
    if change is not None:
        file, old, new = change
        (path / file).write_text(replace_line((path / file).read_text(), old, new))
    subprocess.run(
        ["git", "init", "--quiet", "--initial-branch", "main", "--template=", str(path)],
        check=True,
        capture_output=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_GLOBAL": os.devnull},
    )
    git_commit_all(path, message)
    return path
