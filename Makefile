# Freezing study: `make reproduce` regenerates results/, `make test` runs every test.
# Both create .venv on first use (pinned requirements.txt) and never reinstall while it is current.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONHASHSEED ?= 0

.DEFAULT_GOAL := help
.PHONY: help venv test lint test-slow test-oldest test-downpour test-downpour-oldest test-gpu ci smoke reproduce verify bench lab clean distclean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): requirements.txt requirements-keras-hub.txt pyproject.toml lib/pyproject.toml lib/downpour/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-keras-hub.txt  # no 2nd TensorFlow
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e lib/downpour  # the ps
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e lib  # the study
	@touch $(STAMP)

venv: $(STAMP) ## Create .venv and install the pinned requirements (done by the targets below)

test: $(STAMP) ## Lint (ruff), then the tests (unit, property, doctests, Keras' optimizer tests, a notebook through papermill, the READMEs' and docs/' code blocks); under 10 min
	$(PY) -m ruff check .
	$(PY) -m pytest -m "not slow"

lint: $(STAMP) ## Only the linter make test runs first (ruff: unused names, line length 120, import order; pyproject.toml)
	$(PY) -m ruff check .

test-slow: $(STAMP) ## Run the long checks CI adds after `make test` (every notebook on smoke parameters, clusters, sweeps)
	$(PY) -m pytest -m slow

$(OLDEST_STAMP): requirements-oldest.txt pyproject.toml
	@test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-oldest.txt
	$(OLDEST)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP) ## The library's tests, slow ones included (MirroredStrategy), on the oldest Keras/TensorFlow declared
	$(OLDEST)/bin/python -m pytest -m "slow or not slow" tests/library tests/keras_suite lib/freezing

# downpour on its own: a fresh venv in $TMPDIR (removed after), only TensorFlow, `freezing` and `freezing-downpour[test]`
# with their declared dependencies (the lock as constraints), its tests run from there (pytest --pyargs downpour.tests)
test-downpour: ## The parameter server's tests, from its own install in a clean venv outside the repository
	PYTHON=$(PYTHON) .ci/test-downpour-alone requirements.txt -m "not slow"

test-downpour-oldest: ## The same, at the oldest Keras/TensorFlow declared (requirements-oldest.txt)
	PYTHON=$(PYTHON) .ci/test-downpour-alone requirements-oldest.txt -m "not slow"

# FREEZING_GPU_TESTS_ON_CPU=1 runs the same tests and bench on the CPU: a check that they run, nothing about a GPU.
test-gpu: $(STAMP) ## On a GPU (< 5 min): masked fit under XLA, mixed float16/bfloat16, MirroredStrategy, mask placement, a bench ratio
	@if [ "$$FREEZING_GPU_TESTS_ON_CPU" = 1 ] || $(PY) -c "import sys, tensorflow as tf; sys.exit(not tf.config.list_physical_devices('GPU'))" 2>/dev/null; then \
		$(PY) -c "import tensorflow as tf; print('devices:', [d.name for d in tf.config.list_logical_devices()], tf.config.experimental.get_device_details(tf.config.list_physical_devices('GPU')[0]) if tf.config.list_physical_devices('GPU') else '')" && \
		$(PY) -m pytest -m gpu tests/gpu -s -rA --timeout 240 && \
		$(PY) bench/bench_masked_fit.py --jit --rounds 5 --epochs 1 --steps 20 --variants hold; \
	else \
		echo "no GPU: make test-gpu skipped"; \
		echo "  (TensorFlow lists no GPU; the lock installs tensorflow-cpu: see README, Environment, GPU)"; \
	fi

ci: test test-slow test-oldest test-downpour test-downpour-oldest ## What CI runs (.ci/run)

smoke: $(STAMP) ## Run every notebook on tiny parameters into build/smoke/ (about a minute each)
	$(PY) -m study.report --profile smoke --out build/smoke

reproduce: $(STAMP) ## Regenerate results/ on full parameters; skips what this machine already ran unchanged (FORCE=1: all)
	$(PY) -m study.report --profile full --out results$(if $(FORCE), --force)

verify: $(STAMP) ## Check that every committed result was made from this tree's inputs (runs nothing; make test does it too)
	$(PY) -m study.report --verify

bench: $(STAMP) ## Run the benchmarks (7 to 15 min, on an idle machine); ratios side by side, into results/bench/BENCH.md
	$(PY) bench/run.py --publish results/bench

lab: $(STAMP) ## Open the notebooks in JupyterLab
	$(VENV)/bin/jupyter lab notebooks/

clean: ## Remove build outputs and caches, this machine's record of runs too (keeps .venv and results/)
	rm -rf build .pytest_cache .hypothesis results/.staging
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean ## Also remove .venv and .venv-oldest
	rm -rf $(VENV) $(OLDEST)
