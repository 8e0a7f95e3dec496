# The two commands of the README, spelled out. `make test` is what CI runs.
VENV ?= .venv
PY := $(VENV)/bin/python
# The lowest versions pyproject.toml declares (.ci/lowest.txt), in the lowest Python it declares.
LOWEST_VENV ?= .venv-lowest
LOWEST_PYTHON ?= python3.10

.PHONY: install install-lowest train test test-fast test-lowest lint format clean

$(PY):
	python3 -m venv $(VENV)

# Installed once, and again when pyproject.toml changes: `make test` after `make install` (as CI runs them), or after
# the README's set-up (`pip install -e ".[dev]"`, newer than pyproject.toml, with the dev tools), does not ask pip again.
$(VENV)/installed: pyproject.toml | $(PY)
	if [ -z "$$(find $(VENV) -name 'lightning_ddp_mnist-*.dist-info' -newer pyproject.toml)" ] \
	    || ! $(PY) -m pip show -q pytest pytest-timeout pytest-xdist ruff pre-commit onnx onnxruntime >/dev/null 2>&1; then \
	    $(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q -e ".[dev]"; fi
	touch $@

install: $(VENV)/installed

train: install
	$(PY) train.py $(ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest

# The tests a developer runs while working: without the long multi-process runs (marked slow).
test-fast: install
	$(PY) -m pytest -m "not slow"

# CI's second environment: every dependency at its declared floor (made again when the floors change), then the fast
# tests.
$(LOWEST_VENV)/installed: pyproject.toml .ci/lowest.txt
	rm -rf $(LOWEST_VENV)
	$(LOWEST_PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOWEST_VENV)/bin/python -m pip install -q -c .ci/lowest.txt -e ".[dev]"
	touch $@

install-lowest: $(LOWEST_VENV)/installed

test-lowest: install-lowest
	$(LOWEST_VENV)/bin/python -m pytest -m "not slow" -p no:cacheprovider

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf runs .pytest_cache .ruff_cache $(LOWEST_VENV)
