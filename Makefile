# The README's two commands: `make demo` and `make test`. Each does the whole set-up first
# (virtualenv, pinned installs, data download), so both work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tidal-setup-done
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: setup data demo test lint docs clean

setup: $(STAMP)

# DeepSpeed is an sdist whose setup.py imports torch: --no-build-isolation builds it against the
# torch already in the venv (an isolated build would pull a multi-GB CUDA torch). DS_BUILD_OPS=0
# skips every CUDA op, so it installs without CUDA; DS_BUILD_SHM_COMM=1 prebuilds the one CPU op
# every engine loads (its shared-memory comm op), which otherwise costs ~50 s of JIT compile in
# the first engine of every fresh machine; DS_BUILD_CPU_ADAM=1 prebuilds DeepSpeedCPUAdam, the
# optimizer of every offload plan (JIT: ~1.5 min on 2 cores). --no-cache-dir: a wheel pip cached
# from an earlier build without these ops would be reused.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip wheel setuptools
	$(BIN)/pip install -q torch==2.13.0
	DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 DS_BUILD_CPU_ADAM=1 $(BIN)/pip install -q --no-cache-dir \
	    --no-build-isolation deepspeed==0.19.8
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

data: $(STAMP)
	$(BIN)/python -m tidal.jobs.data

demo: data
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check tidal tests benchmarks examples tools
	$(BIN)/mypy tidal benchmarks
	$(BIN)/lint-imports  # the layers: [tool.importlinter] in pyproject.toml

# the docs site: every page, the CLI and metrics references written from the code, API pages
# from the docstrings; --strict makes a broken link or a missing snippet fail
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site  # (--quiet would hide the warnings --strict counts)

test: data lint docs
	$(BIN)/pytest -q --durations=20

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
