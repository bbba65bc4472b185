PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= configs/example.yaml
# Test workers: four, two per core: while one waits on a process or a deadline another runs (quiet,
# on 2 cores: 350-390 s). WORKERS=1 runs the suite in order, one test at a time.
WORKERS ?= 4

.PHONY: venv run test test-loaded lint bench clean

$(BIN)/mcp-supervisor: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

venv: $(BIN)/mcp-supervisor

# The example's extensions are console scripts of this package: put the venv first on PATH.
run: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/mcp-supervisor daemon -c $(CONFIG)

# Tests write bytecode: with PYTHONDONTWRITEBYTECODE set in the environment, every process of the
# suite would compile the package again (about 0.15 s of CPU each).
test: venv
	$(BIN)/ruff check supervisor tests bench
	PYTHONDONTWRITEBYTECODE= PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -n $(WORKERS) --dist worksteal --durations=10

# The suite with a busy process per core beside it: its deadlines must hold on a loaded machine.
# SUPERVISOR_TEST_SLOWDOWN=N scales every deadline for a slower one (tests/harness/timing.py).
test-loaded: venv
	$(BIN)/python bench/cpuload.py -- $(MAKE) test

lint: venv
	$(BIN)/ruff check supervisor tests bench
	$(BIN)/ruff format --check supervisor tests bench

bench: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/restart.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/media.py --repeat 6
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/gateway.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/throughput.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/hop.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/connect.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/coldstart.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/contain.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/soak.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/hostile.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/scale.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/views.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/storm.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/sandbox.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
