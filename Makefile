# Quick start: `make up` (start Seawall on the built-in model), `make test` (run the test suite).
# Both bootstrap .venv/ on first use; after either, .venv/bin/seawall exists.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.seawall-installed
# The CPU build of torch 2.13.0 lies on local disk here; CUDA hosts may override TORCH_SPEC.
TORCH_SPEC ?= torch==2.13.0

.PHONY: up test lint protos bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

up: $(STAMP)
	$(VENV)/bin/seawall up

test: $(STAMP)
	$(PY) scripts/gen_protos.py --check
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

protos: $(STAMP)
	$(PY) scripts/gen_protos.py

bench: $(STAMP)
	$(PY) bench/kv_waste.py
	$(PY) bench/engine_throughput.py
	$(PY) bench/scheduler_step.py
