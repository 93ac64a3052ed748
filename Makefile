# Every target installs what it needs first; re-running is quick (stamp files).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NPM_STAMP := fixtures/node_modules/.installed

.PHONY: demo test lint bench install clean

install: $(STAMP) $(NPM_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

$(NPM_STAMP): fixtures/package.json fixtures/package-lock.json
	cd fixtures && npm ci --no-audit --no-fund --loglevel=error
	touch $@

demo: install
	$(BIN)/replay-sim demo --once

test: install
	$(BIN)/pytest -q

lint: install
	$(BIN)/ruff check replay_sim tests bench fixtures
	$(BIN)/ruff format --check replay_sim tests bench fixtures
	$(BIN)/mypy
	$(BIN)/lint-imports  # the import contracts of DESIGN.md "Layout" (pyproject.toml)

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) fixtures/node_modules
