# Set-up and checks. `make test` and `make demo` work on a fresh machine: each creates .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_EVALUATE_OFFLINE=1 OMP_NUM_THREADS=1

.PHONY: install test demo benchmark clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	HF_HOME=$$(mktemp -d) $(OFFLINE) $(BIN)/python -m pytest -q tests

# the demo is the only job on the machine: let torch use both cores (DEMO_THREADS=1 leaves one free)
DEMO_THREADS ?= 2
demo: $(STAMP)
	$(OFFLINE) OMP_NUM_THREADS=$(DEMO_THREADS) $(BIN)/python hub_scripts/pipeline.py --profile demo

benchmark: $(STAMP)
	$(OFFLINE) $(BIN)/python benchmarks/calibration_bench.py

clean:
	rm -rf runs build *.egg-info .pytest_cache
