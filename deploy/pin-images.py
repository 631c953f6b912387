"""Pins every image deploy/ applies by digest (deploy/images.yaml lists them).

    python deploy/pin-images.py resolve   # fill the empty digests from the registries
    python deploy/pin-images.py apply     # write name:tag@digest into every reference
    python deploy/pin-images.py check     # exit 1 while an applied reference has no digest

`resolve` asks `crane digest REF`, else `docker buildx imagetools inspect REF`, for the digest of
the multi-platform index (what a node's runtime resolves the tag to); build and push our own
image first. `apply` rewrites `image:` fields, `DAGSTER_CURRENT_IMAGE`, deploy/Dockerfile's
`BASE_IMAGE`, every other mention of an image (the admission policy's run image) and the chart
values' `repository` + `tag` pairs (a tag `T@sha256:...` renders as `repository:T@sha256:...`);
not our own images in deploy/kind (`kind: tag` in images.yaml), which `kind load` gives the
nodes without a registry digest.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent
LOCK = DEPLOY / "images.yaml"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def entries() -> list[dict[str, str]]:
    return yaml.safe_load(LOCK.read_text())["images"]


def files() -> list[Path]:
    return sorted([DEPLOY / "Dockerfile", *(p for p in DEPLOY.rglob("*.yaml") if p != LOCK)])


def references(text: str) -> list[str]:
    """Every image reference of a deploy/ file: `image: REF`, DAGSTER_CURRENT_IMAGE's value, and
    `repository: R` followed by `tag: T` (chart values)."""
    found = re.findall(r"^\s*(?:- )?image:\s*\"?([^\s\"{}]+)\"?\s*$", text, flags=re.MULTILINE)
    found += re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, flags=re.MULTILINE)  # the Dockerfile's base
    found += re.findall(r"DAGSTER_CURRENT_IMAGE\s*\n\s*value:\s*\"?([^\s\"]+)\"?", text)
    for repository, tag in re.findall(r"repository:\s*\"?([^\s\"]+)\"?\s*\n\s*tag:\s*\"?([^\s\"]+)\"?", text):
        found.append(f"{repository}:{tag}")
    return found


def registry_digest(ref: str) -> str:
    if shutil.which("crane"):
        done = subprocess.run(["crane", "digest", ref], capture_output=True, text=True, check=True)
        return done.stdout.strip()
    if shutil.which("docker"):
        done = subprocess.run(
            ["docker", "buildx", "imagetools", "inspect", ref, "--format", "{{json .Manifest}}"],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(done.stdout)["digest"]
    raise SystemExit("pin-images: neither crane nor docker is installed")


def resolve() -> None:
    images = entries()
    for image in images:
        if not image["digest"]:
            image["digest"] = registry_digest(image["ref"])
            if not DIGEST.fullmatch(image["digest"]):
                raise SystemExit(f"{image['ref']}: the registry answered {image['digest']!r}")
    text = LOCK.read_text()
    for image in images:
        text = re.sub(
            rf'(ref: "{re.escape(image["ref"])}", digest: )"[^"]*"', rf'\1"{image["digest"]}"', text
        )
    LOCK.write_text(text)


def apply() -> None:
    images = [i for i in entries() if i["digest"]]
    for path in files():
        text = path.read_text()
        for image in images:
            ref, digest = image["ref"], image["digest"]
            if image.get("kind") == "tag" and (DEPLOY / "kind") in path.parents:
                continue  # `kind load` images carry no registry digest
            name, tag = ref.rsplit(":", 1)
            # name:tag not yet followed by a digest -> name:tag@digest
            text = re.sub(rf"(?<![\w./-]){re.escape(ref)}(?![\w.@-])", f"{ref}@{digest}", text)
            # chart values: repository R / tag "T"
            text = re.sub(
                rf"(repository:\s*\"?{re.escape(name)}\"?\s*\n\s*tag:\s*)\"{re.escape(tag)}\"",
                rf'\1"{tag}@{digest}"',
                text,
            )
        path.write_text(text)


def unpinned() -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(DEPLOY)), ref)
        for path in files()
        for ref in references(path.read_text())
        if not DIGEST.search(ref)
    ]


def main(argv: list[str]) -> None:
    if argv == ["resolve"]:
        resolve()
    elif argv == ["apply"]:
        apply()
    elif argv == ["check"]:
        missing = unpinned()
        for path, ref in missing:
            print(f"{path}: {ref} has no digest", file=sys.stderr)
        raise SystemExit(1 if missing else 0)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
