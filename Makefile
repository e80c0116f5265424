# `make repro` runs the default comparison; `make test` runs the tests. Both create .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# DVC must never phone home (also set in .dvc/config for users who call dvc directly).
export DVC_NO_ANALYTICS := 1
export DVC_STUDIO_OFFLINE := true
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install repro test test-fast lint bench golden cli-docs gpu-check browser clean

install: $(STAMP)

# torch==2.13.0 first: it is the CPU wheel on disk; letting pip resolve "torch" from the
# package's range could fetch a multi-GB CUDA build instead.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,peers]'
	touch $(STAMP)

# `dvc repro` with independent stages side by side (tailkit/pipeline/parallel_repro.py): the same
# outputs and dvc.lock, sooner on a machine with more than one core.
JOBS ?= 2
repro: $(STAMP)
	$(BIN)/python -m tailkit repro --jobs $(JOBS)
	@cat reports/summary.md
	@echo "The study's page: reports/index.html (open it in a browser; it needs no server)."

# mypy first: the plugin seam strictly, the rest at the default level (pyproject.toml).
test: $(STAMP)
	$(BIN)/mypy
	$(BIN)/pytest --durations=25

# The browser the HTML pages' tests drive (tests/browser.py): Debian's Chromium. Elsewhere,
# install any Chromium or Chrome and set TAILKIT_CHROMIUM to its binary.
browser:
	apt-get install -y -q chromium || (apt-get update -q && apt-get install -y -q chromium)

# The unit tier, under three minutes on 2 cores: everything but the end-to-end runs of dvc, pip
# and several processes and the tests over a second (tests/slow_tests.txt).
test-fast: $(STAMP)
	$(BIN)/pytest -m "not slow" --durations=10

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The golden pipeline's output hashes (tests/test_golden.py), after an intended change to outputs.
golden: $(STAMP)
	$(BIN)/python -m tailkit.testing.golden --write tests/golden/hashes.json

# docs/cli.md from the commands' --help (tests/test_cli_reference.py), after a command changes.
cli-docs: $(STAMP)
	$(BIN)/python -m tailkit.testing.cli_reference --write docs/cli.md

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_step.py

# On a lent GPU machine: its own python3 (CUDA's torch), not this venv (benchmarks/gpu_check.sh).
gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf $(VENV) data .dvc/tmp .dvc/cache
