# The two commands of the README, spelled out. `make test` is what CI runs.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install train test lint format clean

$(PY):
	python3 -m venv $(VENV)

install: $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"

train: install
	$(PY) train.py $(ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf runs .pytest_cache .ruff_cache
