# Set-up and checks. `make test` and `make demo` work on a fresh machine: each installs Debian's Fashion-MNIST when
# missing (as root with apt-get; otherwise it stops at once, naming the command) and creates .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_EVALUATE_OFFLINE=1 OMP_NUM_THREADS=1

# the real dataset the tests and the demo use; TIMM_CSM_FASHION_MNIST moves it, as it does for the package
FASHION_MNIST_DIR ?= $(or $(TIMM_CSM_FASHION_MNIST),/usr/share/datasets/fashion-mnist)
FASHION_MNIST_INSTALL := apt-get update && apt-get install -y dataset-fashion-mnist

.PHONY: install fashion-mnist test demo benchmark boundary docs docs-tables docs-screenshot dist clean

fashion-mnist:
	@if [ -f "$(FASHION_MNIST_DIR)/train-images-idx3-ubyte.gz" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "Fashion-MNIST is missing from $(FASHION_MNIST_DIR). Install it, then re-run make:" >&2; \
	  echo "  sudo sh -c '$(FASHION_MNIST_INSTALL)'" >&2; \
	  echo "(or set TIMM_CSM_FASHION_MNIST to a folder holding its four IDX files)" >&2; exit 1; \
	fi; \
	echo "Fashion-MNIST is missing: $(FASHION_MNIST_INSTALL)"; \
	$(FASHION_MNIST_INSTALL) || exit 1; \
	if [ ! -f "$(FASHION_MNIST_DIR)/train-images-idx3-ubyte.gz" ]; then \
	  echo "dataset-fashion-mnist is installed but $(FASHION_MNIST_DIR) has no IDX files" >&2; exit 1; \
	fi

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

# the demo needs the package with its generation, plots and statistics extras only: the dev extras (the tests' and
# the benchmarks' peers, the docs) would lengthen a fresh set-up; an environment that has them serves it too
DEMO_STAMP := $(VENV)/.installed-demo
$(DEMO_STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
	$(BIN)/pip install --quiet -e ".[gen,plots,calibration]"
	touch $(DEMO_STAMP)

install: $(STAMP)

# one worker per core, each test file on one worker (a file's module fixtures are built once)
test: fashion-mnist $(STAMP)
	HF_HOME=$$(mktemp -d) $(OFFLINE) $(BIN)/python -m pytest -q -n auto --dist loadfile --durations=25 tests

# the demo is the only job on the machine: let torch use both cores (DEMO_THREADS=1 leaves one free)
DEMO_THREADS ?= 2
demo: fashion-mnist $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	$(OFFLINE) OMP_NUM_THREADS=$(DEMO_THREADS) $(BIN)/python -m timm_csm.commands.pipeline --profile demo

# the calibration benchmark of benchmarks/PROTOCOL.md: each setting's generated set (resumable, hours on a CPU), then
# the cells of both settings (hours; finished cells are committed under benchmarks/cells and never re-run)
benchmark: fashion-mnist $(STAMP)
	$(OFFLINE) $(BIN)/python benchmarks/matched_setting.py --setting borrowed
	$(OFFLINE) $(BIN)/python benchmarks/matched_setting.py --setting matched
	$(OFFLINE) $(BIN)/python benchmarks/calibration_bench.py --recipe borrowed
	$(OFFLINE) $(BIN)/python benchmarks/calibration_bench.py --recipe matched
	$(OFFLINE) $(BIN)/python benchmarks/matched_setting.py --compare benchmarks/settings_quality.json

# the boundary study of benchmarks/PROTOCOL.md (amendment 1), after `make benchmark`
boundary: benchmark
	$(OFFLINE) $(BIN)/python benchmarks/calibration_bench.py --recipe matched --methods csm_groups25 csm_groups50
	$(OFFLINE) $(BIN)/python benchmarks/matched_setting.py --setting matched-gen2000
	$(OFFLINE) $(BIN)/python benchmarks/calibration_bench.py --recipe matched --methods csm_gen2000

# the documentation site, into site/, warnings as errors (tests/test_docs.py builds it in CI)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# the pages' generated tables (flags, registries), rewritten from their sources (tests/test_docs.py checks them)
docs-tables: $(STAMP)
	$(BIN)/python docs/build_hooks.py

# docs/site_home.png: the built home page in headless chromium (Debian's chromium package)
CHROMIUM_FLAGS := --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
	--disable-sync --no-first-run --hide-scrollbars --window-size=1280,900
docs-screenshot: docs
	chromium $(CHROMIUM_FLAGS) --screenshot=docs/site_home.png file://$(CURDIR)/site/index.html

# the sdist and the wheel (built from the sdist), into dist/, by PyPA's build in a small environment of its own: the
# packaging tools only, not the development environment (tests/test_distribution.py builds and installs them in CI)
BUILD_VENV := .venv-build
$(BUILD_VENV)/.installed:
	$(PY) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/pip install --quiet --upgrade build setuptools wheel
	touch $@

dist: $(BUILD_VENV)/.installed
	rm -rf dist
	$(BUILD_VENV)/bin/python -m build --no-isolation --outdir dist .

clean:
	rm -rf runs build dist site *.egg-info .pytest_cache
