# The two entry points of the README: `make study` and `make test`. Both set up what is missing first.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup system-deps study test test-unit lint clean-cluster

NATIVE := $(VENV)/.capture-native

setup: system-deps $(STAMP) $(NATIVE)

system-deps:
	@PYTHON="$(PYTHON)" bash envs/bootstrap.sh

# Reinstall only when the pinned requirements or the package metadata change.
$(STAMP): envs/requirements.txt envs/dev-requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r envs/dev-requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

# The capture's C++ kernel, built against this environment's torch into it (~1 min once).
$(NATIVE): $(STAMP) src/commscope/workload/capture_native.cpp src/commscope/workload/capture_native.py
	$(BIN)/python -m commscope.workload.capture_native
	touch $(NATIVE)

study: setup
	source $(BIN)/activate && snakemake --cores 8 report

test: lint
	source $(BIN)/activate && pytest -q -rs tests

# The fast loop while editing: pure logic only, no processes (tests/unit/conftest.py enforces it).
test-unit: setup
	source $(BIN)/activate && pytest -q tests/unit

lint: setup
	source $(BIN)/activate && ruff check src tests workflow benchmarks && ruff format --check src tests workflow benchmarks \
	  && snakefmt --check Snakefile workflow/rules && snakemake --lint >/dev/null \
	  && lint-imports

# Remove every namespace, interface, qdisc and process a crashed run of this checkout's cluster
# (config/config.yaml's cluster.name) may have left behind; `commscope cleanup --all` for all.
clean-cluster: setup
	$(BIN)/commscope cleanup
