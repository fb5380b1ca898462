# Quick start: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-quick test bench findings install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first, pinned: the local CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/creditrl demo

demo-quick: $(STAMP)
	$(BIN)/creditrl demo --quick

bench: $(STAMP)
	$(BIN)/creditrl bench --curve 50 --scaling --out runs/bench

# FINDINGS.md from findings/*.yaml and their grids (resumable: finished runs are read back);
# JOBS runs at a time, each with torch threads / JOBS threads (benchmarks/compare_jobs.py)
JOBS ?= 2
findings: $(STAMP)
	$(BIN)/creditrl findings --jobs $(JOBS)

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache
