# Every target installs what it needs first; re-running is quick (stamp files).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NPM_STAMP := fixtures/node_modules/.installed

.PHONY: demo test lint docs bench install clean

# PyTorch's CPU wheels: PyPI's torch==2.13.0 on Linux is the CUDA build plus ~17 nvidia-*/cuda-* packages.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

install: $(STAMP) $(NPM_STAMP)

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) (first run only)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: an unpinned torch would pull a multi-GB CUDA build.
	@echo "==> installing torch 2.13.0, CPU build (a few minutes on a first run)"
	# PyTorch's CPU index first; where it cannot be reached, the default index, without waiting long.
	$(BIN)/pip install -q --timeout 5 --retries 0 torch==2.13.0 --index-url $(TORCH_CPU_INDEX) \
		|| $(BIN)/pip install -q torch==2.13.0
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
	$(BIN)/replay-sim demo --once  # on a free port: 8765 may be taken

test: install
	$(BIN)/pytest -q -n auto  # one worker per core: about 1.7x faster on two

lint: install
	$(BIN)/ruff check replay_sim tests bench fixtures
	$(BIN)/ruff format --check replay_sim tests bench fixtures
	$(BIN)/mypy
	$(BIN)/lint-imports  # the import contracts of DESIGN.md "Layout" (pyproject.toml)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site-check  # the docs, strictly

docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict  # into site/; `$(BIN)/mkdocs serve` to browse live

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) fixtures/node_modules site build/site-check
