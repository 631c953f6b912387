"""Secrets mounted as files (deploy/: Secret volumes) reach every reader as variables: NAME_FILE
names the file NAME is read from where NAME is unset, in the process's own environment, which
`FleetSettings.from_env()` fills before it reads it (the code location does at import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fleet_pipelines.settings import SECRET_FILE_VARIABLES, read_secret_files

READER = """
import os
from fleet_pipelines.settings import FleetSettings
settings = FleetSettings.from_env()
print(settings.push_remote, "FLEET_LLM_API_KEY" in settings.engine_secrets_set,
      settings.nats_options().password, os.environ["FLEET_GIT_TOKEN"], sep="|")
"""


def test_a_process_reads_its_secrets_from_the_files_the_variables_name(tmp_path: Path):
    values = {
        "FLEET_LLM_API_KEY": "key-1",
        "NATS_USER": "fleet",
        "NATS_PASSWORD": "pw-2",
        "FLEET_GIT_TOKEN": "tok-3",
        "FLEET_PUSH_REMOTE": "https://git.example.com/repo.git",
    }
    assert set(values) == set(SECRET_FILE_VARIABLES)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "FLEET_STATE_DIR": str(tmp_path / "state")}
    for name, value in values.items():
        (tmp_path / name).write_text(value + "\n")  # as `kubectl create secret --from-file` may hold it
        env[f"{name}_FILE"] = str(tmp_path / name)
    done = subprocess.run([sys.executable, "-c", READER], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "https://git.example.com/repo.git|True|pw-2|tok-3"


def test_a_variable_that_is_set_wins_over_its_file(tmp_path: Path):
    (tmp_path / "key").write_text("from-file")
    environ = {"FLEET_LLM_API_KEY": "from-variable", "FLEET_LLM_API_KEY_FILE": str(tmp_path / "key")}
    read_secret_files(environ)
    assert environ["FLEET_LLM_API_KEY"] == "from-variable"
    environ = {"FLEET_LLM_API_KEY_FILE": str(tmp_path / "key")}
    read_secret_files(environ)
    assert environ["FLEET_LLM_API_KEY"] == "from-file"
