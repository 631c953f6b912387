"""The one image installs what CI tests: deploy/Dockerfile installs only through the Makefile's
`install` target, whose recipe (read with `make -n`) is the one `make test` runs, on the
Python CI runs, under one constraints file (deploy/constraints.txt) that pins every package of the
`cpu` image, Ray first, for both targets, at the versions installed here. Docker itself is not
available here; the image build is not run.

Regenerate the constraints from a fresh `make install` venv:
    .venv/bin/python -m tests.unit.test_deploy_image > deploy/constraints.txt"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def run_instructions() -> list[str]:
    """RUN instructions of the Dockerfile with line continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line[4:].strip() for line in joined.splitlines() if line.startswith("RUN ")]


def make_dry_run(*args: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def pip_installs(lines: list[str]) -> list[str]:
    return [line for line in lines if " pip install " in f" {line} " and "--upgrade pip" not in line]


def commands() -> list[list[str]]:
    """Each command of the RUN instructions (`&&` chains split), as words."""
    return [shlex.split(part) for command in run_instructions() for part in command.split("&&")]


def image_installs() -> list[tuple[str, str]]:
    """(make target, EXTRAS) of each `make install ...` in the Dockerfile."""
    found = []
    for words in commands():
        if words[:1] == ["make"]:
            variables = dict(w.split("=", 1) for w in words[2:])
            found.append((words[1], variables["EXTRAS"]))
    return found


def test_the_dockerfile_installs_python_packages_only_from_the_hashed_locks_and_make_install():
    """pip runs only on a lock, with every hash required and nothing resolved beyond it; the project
    itself through `make install`, the recipe CI runs."""
    pip_runs = [w for w in commands() if "pip" in w]
    assert [w[w.index("-r") + 1] for w in pip_runs] == [
        "deploy/requirements-cpu.lock",
        "deploy/requirements-gpu.lock",
    ]
    for words in pip_runs:
        assert {"--require-hashes", "--no-deps"} <= set(words)
    assert image_installs() == [("install", "k8s"), ("install", "k8s,vllm-gpu")]
    for _, extras in image_installs():
        assert set(extras.split(",")) <= set(PYPROJECT["project"]["optional-dependencies"])


def lock_entries(path: Path) -> dict[str, tuple[str, list[str]]]:
    """Package -> (version, sha256 hashes) of a lock written by deploy/lock.py."""
    joined = re.sub(r"\\\n\s*", " ", path.read_text())
    found = {}
    for line in joined.splitlines():
        if line.strip() and not line.startswith("#"):
            requirement, *options = line.split()
            name, version = requirement.split("==")
            found[canonicalize_name(name)] = (version, [o.removeprefix("--hash=sha256:") for o in options])
    return found


def test_the_cpu_lock_pins_exactly_the_constraints_with_hashes():
    """deploy/requirements-cpu.lock is deploy/constraints.txt with the hashes of PyPI's files
    (deploy/lock.py cpu); a changed pin without a new lock fails here."""
    entries = lock_entries(ROOT / "deploy" / "requirements-cpu.lock")
    assert {name: version for name, (version, _) in entries.items()} == constraint_pins()
    for name, (_, digests) in entries.items():
        assert digests and all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests), name


def test_image_install_runs_the_same_recipe_as_make_test(tmp_path: Path):
    venv = tmp_path / "venv"  # absent, so the dry run prints the whole install chain
    test_chain = make_dry_run("test", f"VENV={venv}")
    (test_pip,) = pip_installs(test_chain)
    for target, extras in image_installs():
        (image_pip,) = pip_installs(make_dry_run(target, f"VENV={venv}", f"EXTRAS={extras}"))
        assert image_pip == test_pip.replace("'.[dev,k8s]'", f"'.[{extras}]'")
    # The venv is created by the same interpreter command in both.
    assert f"python3 -m venv {venv}" in test_chain


def test_the_image_runs_the_python_ci_tests_with():
    (version,) = re.findall(r"^ARG PYTHON_VERSION=(\S+)$", DOCKERFILE, flags=re.MULTILINE)
    assert version == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert PYPROJECT["project"]["requires-python"] == f">={version}"
    # The base image is that Python (pin-images.py may have added its digest).
    (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE, flags=re.MULTILINE)
    assert base.split("@")[0] == f"docker.io/library/python:{version}-slim-bookworm"
    assert "FROM ${BASE_IMAGE} AS base" in DOCKERFILE


def test_the_code_server_command_loads_our_code_location():
    module = PYPROJECT["tool"]["dagster"]["module_name"]
    cmds = re.findall(r"^CMD (.+)$", DOCKERFILE, flags=re.MULTILINE)
    assert len(cmds) == 2
    for cmd in cmds:
        assert f'"--module-name", "{module}"' in cmd


def stages() -> dict[str, str]:
    """Stage name -> its text."""
    parts = re.split(r"^FROM \S+ AS (\S+)$", DOCKERFILE, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def apt_packages(stage: str) -> set[str]:
    joined = re.sub(r"\\\n\s*", " ", stages()[stage])
    found = set()
    for match in re.finditer(r"apt-get install (?:-\S+ )*([^&]+)", joined):
        found |= {w for w in match.group(1).split() if not w.startswith("-")}
    return found


def test_the_gpu_image_can_compile_tritons_modules():
    """Triton compiles small C modules when vLLM starts: a C compiler and libc headers (the
    Python headers come with the python base image)."""
    assert {"gcc", "libc6-dev"} <= apt_packages("gpu")
    assert "gcc" not in apt_packages("cpu") | apt_packages("base")


def test_both_images_run_as_an_unprivileged_user_with_the_venv_on_every_path():
    for stage in ("cpu", "gpu"):
        assert re.search(r"^USER 10001:10001$", stages()[stage], flags=re.MULTILINE), stage
    base = stages()["base"]
    assert "useradd --uid 10001" in base
    assert 'chown 10001:10001 "$DAGSTER_HOME"' in base
    # A login shell resets PATH from /etc/profile; profile.d puts the venv back.
    assert "export PATH=/opt/venv/bin:$PATH' > /etc/profile.d/" in base


CONSTRAINTS = ROOT / "deploy" / "constraints.txt"


def installed_closure(extras: set[str]) -> dict[str, str]:
    """Package -> installed version of everything `pip install '.[extras]'` brings, from this
    environment's metadata (markers evaluated here: Linux, this Python)."""
    pins: dict[str, str] = {}
    todo, done = [("fleet-pipelines", frozenset(extras))], set()
    while todo:
        name, wanted = todo.pop()
        if (canonicalize_name(name), wanted) in done:
            continue
        done.add((canonicalize_name(name), wanted))
        dist = metadata.distribution(name)
        pins[canonicalize_name(dist.metadata["Name"])] = dist.version
        for requirement in map(Requirement, dist.requires or []):
            environments = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(e) for e in environments):
                todo.append((requirement.name, frozenset(requirement.extras)))
    pins.pop("fleet-pipelines")
    return pins


def constraint_pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def render_constraints() -> str:
    header = (
        "# Pins for both images (deploy/Dockerfile sets PIP_CONSTRAINT to this file): every package of\n"
        "# the cpu image (pyproject's k8s extra) at the version `make test` ran with, so the CPU and GPU\n"
        "# images (Ray Client's two ends) cannot resolve Ray or a shared package differently.\n"
        "# `make install` and `make install-vllm` resolve under it too, so a pin vLLM cannot take\n"
        "# (numpy < 2.4 for vllm 0.32) fails CI's vLLM install instead of the GPU image's build.\n"
        "# Regenerate after a dependency change: resolve pyproject's dev,k8s,vllm extras together\n"
        "# (pip install --dry-run --report), install, then\n"
        "# .venv/bin/python -m tests.unit.test_deploy_image > deploy/constraints.txt\n"
    )
    pins = installed_closure({"k8s"})
    return header + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))


def test_both_images_install_under_one_constraints_file():
    (constraint,) = re.findall(r"PIP_CONSTRAINT=(\S+)", stages()["base"])
    assert constraint == "/opt/fleet/deploy/constraints.txt"
    assert (
        "COPY deploy/constraints.txt deploy/requirements-cpu.lock deploy/requirements-gpu.lock* ./deploy/"
        in stages()["base"]
    )
    pins = constraint_pins()
    (ray,) = [p for p in PYPROJECT["project"]["dependencies"] if p.startswith("ray[")]
    assert Requirement(ray).specifier.contains(pins["ray"])


def test_the_makefile_installs_under_the_images_constraints():
    makefile = (ROOT / "Makefile").read_text()
    assert "CONSTRAINTS := deploy/constraints.txt" in makefile
    assert "PIP_CONSTRAINT=$(CONSTRAINTS) $(PY) -m pip install" in makefile


def test_the_constraints_pin_every_package_of_the_cpu_image_at_the_tested_version():
    """What CI installed (this venv, under the same file) is what the images get; a package the
    image needs and the file lacks would float. Run under a `make install` venv."""
    assert constraint_pins() == installed_closure({"k8s"})


if __name__ == "__main__":
    print(render_constraints(), end="")
