# Quick start: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-quick test test-cpu-kinds lint bench performance findings results install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first, pinned: the local CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
# Then the package within its ranges (pyproject.toml) at the tested exact versions (constraints.txt).
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/creditrl demo

demo-quick: $(STAMP)
	$(BIN)/creditrl demo --quick

# speed against TRL and HF generate (benchmarks/bench.py)
bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py --curve 50 --scaling --out runs/bench --results docs/results/bench.md

# long outputs, model sizes and the study settings (about an hour on 2 cores), held to the performance
# issue's targets; BASELINE=DIR adds arith.yaml against a checkout of older code (git worktree add DIR d760505)
BASELINE ?=
PERFORMANCE_TARGETS := --min-speedup 3 --min-bandwidth-share 0.5 --min-peak-share 0.5 --min-baseline-speedup 2 \
	--max-rss-mb 4096
performance: $(STAMP)
	$(BIN)/python benchmarks/performance.py --out runs/performance --results docs/results/performance.md \
		$(PERFORMANCE_TARGETS) $(if $(BASELINE),--baseline $(BASELINE))

# FINDINGS.md from findings/*.yaml and their grids (resumable: finished runs are read back);
# JOBS runs at a time, each with torch threads / JOBS threads (benchmarks/compare_jobs.py)
JOBS ?= 2
findings: $(STAMP)
	$(BIN)/creditrl findings --jobs $(JOBS)
	$(BIN)/python docs/glance.py

# README's results table from the JSON of the pages it links (docs/glance.py; tests/test_readme.py checks it)
readme: $(STAMP)
	$(BIN)/python docs/glance.py

# ruff (style and likely bugs) and import-linter (the layers of docs/design.md), then every test
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks studies examples
	$(BIN)/ruff format --check src tests benchmarks studies examples
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest

# the suite as another x86-64 CPU would run it (.ci/cpu-kind): torch's, MKL's, oneDNN's and numpy's
# kernels capped at AVX2, then at the x86-64 baseline; no test may depend on which kind runs it
CPU_KINDS ?= avx2 default
test-cpu-kinds: lint
	for kind in $(CPU_KINDS); do echo "== CPU kind $$kind"; .ci/cpu-kind $$kind $(BIN)/python -m pytest || exit 1; done

# every page under docs/results/, each written by the command that measures it (a few hours on 2 cores);
# PACKAGE_BASE=DIR compares the package's size with another checkout (git worktree add DIR cd01afc)
PACKAGE_BASE ?=
results: $(STAMP)
	$(BIN)/creditrl demo --run-dir runs/demo --results docs/results/demo.md
	$(BIN)/creditrl demo src/creditrl/configs/arith.yaml --run-dir runs/demo-arith --results docs/results/demo_arith.md
	$(BIN)/python -m studies.prm --out runs/prm-report --results docs/results/prm.md
	$(BIN)/python -m studies.search --out runs/search-report --results docs/results/search.md
	$(BIN)/python benchmarks/credit_speed.py --results docs/results/credit_speed.md
	$(BIN)/python benchmarks/ray_overhead.py --results docs/results/scale_out.md
	$(BIN)/python benchmarks/dependency_check.py --results docs/results/dependencies.md
	$(BIN)/python benchmarks/package_size.py --results docs/results/package.md $(if $(PACKAGE_BASE),--base $(PACKAGE_BASE))
	$(BIN)/python -m studies.long_outputs --results docs/results/long_outputs.md
	$(BIN)/python -m studies.long_outputs --set "task.args={min_steps: 41, max_steps: 61, modulus: 10, heldout_mod: 2}" --set "sft.task_args={min_steps: 1, max_steps: 99, modulus: 10, heldout_mod: 2}" --set sft.steps=2000 --results docs/results/long_outputs_mod10.md
	$(BIN)/python -m studies.scheduled_sampling --jobs 2 --summaries findings/runs/exposure --results docs/results/scheduled_sampling.md
	$(MAKE) bench
	$(MAKE) performance

clean:
	rm -rf $(VENV) runs .pytest_cache
