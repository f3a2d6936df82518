# Two commands on a fresh machine:   make demo   (train the default glyphs recipe)   make test
# Each creates .venv and installs what it needs. On machines with a CPU-only torch wheel on disk
# (torch==2.13.0), that build is installed first so pip never fetches a multi-GB CUDA build;
# elsewhere set TORCH=torch (or any spec) to take your usual build.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

.PHONY: demo test test-slow lint
demo: $(VENV)/.installed
	$(VENV)/bin/omnialign train --resume auto

test: $(VENV)/.installed
	$(PY) -m pytest -q

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q --runslow

lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check . && $(VENV)/bin/ruff check .
