# Two commands do all the set-up: `make demo` (main job) and `make test` (tests).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install bytecode demo test test-cpu check test-agents agent-clis lint docs bench tinygpt clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,llm,ray,report,docs,mcp]'
	# torch only for the tinygpt example and its test (pinned: the CPU build on disk)
	$(BIN)/pip install -q torch==2.13.0 || echo "torch unavailable: the tinygpt test will skip"
	$(BIN)/python -m compileall -q src  # an editable install compiles nothing
	touch $(STAMP)

install: $(STAMP)

# The main job: an end-to-end study on the bundled CPU kernel example (no API key needed).
demo: $(STAMP)
	bash scripts/run_example.sh kernel-cpu

# Two passes. Side by side (pytest-xdist): 4 workers on 2 cores, since most of a
# study-driven test is waiting on its jobs' processes; tests sharing a built study stay on
# one worker (tests/conftest.py). A test that asserts an order of events holds the
# evaluations that must wait (tests/gates.py) rather than sleeping seconds apart, so load
# does not reorder them. Then the `timing` tests, which measure CPU work, one at a time.
# The timing pass collects only the files that name its marker (collecting all ~900 tests
# costs a pytest process ~6 CPU-s); tests/conftest.py fails a marked test whose file does
# not name it.
PYTEST_WORKERS ?= 4
# The venv first on PATH, as `source .venv/bin/activate` does: a task's `python` and the
# fake engines' `python3` are then the venv's, not a version manager's shim (pyenv's costs
# ~0.08 CPU-s a start: a third of tests/backends/test_shell.py's CPU).
PYTEST = PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest
TIMING_FILES = $(shell grep -rlE 'mark\.timing\b' tests --include='test_*.py')
# Bytecode made once, before the passes. Where the environment sets PYTHONDONTWRITEBYTECODE
# (this machine's does), nothing is cached, and every process the suite starts (workers,
# evaluators, the CLI) compiled ratchet's modules from source again: 0.13 CPU-s more for
# `import ratchet.cli`, 0.05 for the kernel harness, 0.02 for a worker. compileall writes
# them (it looks only at stale files: 0.1 s when nothing changed).
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q src tests

test: $(STAMP) bytecode
	$(PYTEST) -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=25 -m "not timing"
	$(PYTEST) -q --durations=5 -m timing $(TIMING_FILES)

# Where the suite's CPU goes (root: each test in a cpuacct cgroup; tests/cpu_by_test.py):
# the side-by-side pass as `make test` runs it, then the CPU by file, largest first.
CPU_DIR ?= cpu-by-test
test-cpu: $(STAMP) bytecode
	rm -rf $(CPU_DIR)
	RATCHET_CPU_DIR=$(CPU_DIR) PYTHONPATH=tests $(PYTEST) -q -n $(PYTEST_WORKERS) \
	  --dist loadgroup -m "not timing" -p cpu_by_test
	$(BIN)/python scripts/suite_cpu.py $(CPU_DIR)

# The inner loop (about 2 minutes with lint): the tests that start no study and no CLI.
UNIT_TESTS := tests/test_stats.py tests/test_judge.py tests/test_vocab.py \
  tests/test_config.py tests/test_knobs.py tests/test_proposals.py tests/test_headlines.py \
  tests/test_ledger_migrations.py tests/test_fingerprint.py tests/test_gitrepo.py \
  tests/test_import_rules.py tests/test_docs_reference.py tests/test_bench_record.py \
  tests/proposers/test_edits.py tests/proposers/test_example_configs.py \
  tests/backends/test_engine_configs.py tests/security/test_units.py
check: lint bytecode
	$(PYTEST) -q -n 2 $(UNIT_TESTS)

# The real coding-agent CLIs (Claude Code, Codex, aider), pinned, into .venv-agents/; the
# tests in tests/agent_cli (marker agent_cli, part of `make test`) skip without them.
agent-clis:
	PYTHON=$(PYTHON) bash scripts/install_agent_clis.sh

test-agents: $(STAMP) agent-clis
	$(BIN)/python -m pytest -q -m agent_cli

# ruff over everything; mypy over the package (configured in pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy

# The docs site into site/ (gitignored); --strict: a broken link or include fails it.
# The reference pages are generated from the code: python scripts/gen_reference.py
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python bench/throughput.py

# The tinygpt example needs PyTorch (CPU build, pinned so pip takes the local wheel).
tinygpt: $(STAMP)
	bash scripts/run_example.sh tinygpt

clean:
	rm -rf $(VENV) .venv-agents build site *.egg-info src/*.egg-info
