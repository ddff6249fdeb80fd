# genbatch developer entry points.
#   make demo   set up .venv (CPU torch on machines without an NVIDIA GPU) and run the example manifest
#   make test   set up .venv with the test extras and run the test suite (all but the tests marked slow)
#   make test-slow  the tests marked slow (the larger matrices; .ci/run runs them after make test), on two
#               pytest-xdist workers: they wait on processes more than they compute
#   make docs   build the documentation site (docs/, mkdocs.yml) into site/ with mkdocs build --strict
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: setup setup-test demo test test-slow docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	./scripts/install-torch $(BIN)/pip
	$(BIN)/pip install -q -e .

setup-test: $(BIN)/python
	./scripts/install-torch $(BIN)/pip
	$(BIN)/pip install -q -e '.[test,docs]'

demo: setup
	$(BIN)/gen run examples/manifest.parquet --out runs/example --model tiny-wan
	@echo "gen is in $(BIN): run 'source $(BIN)/activate' to put it on this shell's PATH"

test: setup-test
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --dist loadfile --no-loadscope-reorder --durations=40

test-slow: setup-test
	$(BIN)/python -m pytest -q -m slow -n 2 --dist loadfile --no-loadscope-reorder --durations=20

docs: setup-test
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) runs site
