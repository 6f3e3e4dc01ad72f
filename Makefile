# devplace — set-up and common jobs.  `make train` and `make test` do all set-up.
PYTHON ?= python3
VENV ?= .venv
# CPU wheel by default; GPU users: make setup TORCH_SPEC="torch==2.13.0" TORCH_INDEX="--index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
# exact versions of the other dependencies (empty: the newest that pyproject.toml allows)
CONSTRAINTS ?= constraints.txt
PIP = $(VENV)/bin/python -m pip
PY = $(VENV)/bin/python

.PHONY: setup bytecode train test lint format bench clean constraints

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(PY) -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/constraints.txt
	$(PIP) install -q -c $(VENV)/constraints.txt $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e ".[dev]"
	echo "$(CONSTRAINTS)" > $(VENV)/constraints-used
	touch $@

setup: $(VENV)/.installed

# the package's own bytecode, written once: with PYTHONDONTWRITEBYTECODE set (as on the CI
# machines) every process -- each CLI run, each rank's fork server -- compiled it again
bytecode: setup
	$(PY) -m compileall -q -j0 agents graphs placement_env runners runtime scripts tests > /dev/null

train: bytecode
	$(PY) -m runners.train +env=gpt2_8gpu $(ARGS)

# pytest-xdist workers: one per core, at most 4 (TEST_WORKERS=0 runs the tests in one process)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)

test: bytecode
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(ARGS)

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

bench: setup
	$(PY) scripts/bench_extract.py
	$(PY) scripts/bench_simulator.py
	$(PY) scripts/bench_env.py

constraints: setup
	$(PY) .ci/constraints.py > constraints.txt

clean:
	rm -rf $(VENV) outputs multirun wandb .pytest_cache
