# The two commands of the quick start. Both create ./.venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/rollouts demo

test: $(VENV)/.installed-test
	$(BIN)/pytest -q

bench: $(VENV)/.installed
	$(BIN)/python bench/orchestration.py

clean:
	rm -rf $(VENV) .rollouts
