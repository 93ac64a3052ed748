# Every target installs what it needs first; re-running is quick (stamp files).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NPM_STAMP := fixtures/node_modules/.installed

.PHONY: demo test lint bench install clean

install: $(STAMP) $(NPM_STAMP)

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) (first run only)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: an unpinned torch would pull a multi-GB CUDA build.
	@echo "==> installing torch 2.13.0 (CPU build; a few minutes on a first run)"
	$(BIN)/pip install -q torch==2.13.0
	@echo "==> installing replay-sim and its pinned dependencies (a few minutes on a first run)"
	$(BIN)/pip install -q -e '.[dev]'
	touch $@
	@echo "==> Python environment ready"

$(NPM_STAMP): fixtures/package.json fixtures/package-lock.json
	@echo "==> installing the pinned npm reference MCP servers into fixtures/node_modules"
	cd fixtures && npm ci --no-audit --no-fund --loglevel=error
	touch $@

demo: install
	@echo "==> running the demo: serving the shipped recordings (loading the embedding model takes a moment)"
	$(BIN)/replay-sim demo --once

test: install
	$(BIN)/pytest -q -n auto  # one worker per core: about 1.7x faster on two

lint: install
	$(BIN)/ruff check replay_sim tests bench fixtures
	$(BIN)/ruff format --check replay_sim tests bench fixtures
	$(BIN)/mypy
	$(BIN)/lint-imports  # the import contracts of DESIGN.md "Layout" (pyproject.toml)

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) fixtures/node_modules
