# Freezing study: `make reproduce` regenerates results/, `make test` runs every test.
# Both create .venv on first use (pinned requirements.txt) and never reinstall while it is current.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONHASHSEED ?= 0

.DEFAULT_GOAL := help
.PHONY: help venv test smoke reproduce bench lab clean distclean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): requirements.txt pyproject.toml lib/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e lib  # the study
	@touch $(STAMP)

venv: $(STAMP) ## Create .venv and install the pinned requirements (done by the targets below)

test: $(STAMP) ## Run all tests: unit, property, and every notebook on smoke parameters
	$(PY) -m pytest

smoke: $(STAMP) ## Run every notebook on tiny parameters into build/smoke/ (about a minute each)
	$(PY) -m study.report --profile smoke --out build/smoke

reproduce: $(STAMP) ## Regenerate results/ on full parameters; skips what this machine already ran unchanged (FORCE=1: all)
	$(PY) -m study.report --profile full --out results$(if $(FORCE), --force)

bench: $(STAMP) ## Run the benchmarks; prints ratios measured side by side in one run
	$(PY) bench/run.py

lab: $(STAMP) ## Open the notebooks in JupyterLab
	$(VENV)/bin/jupyter lab notebooks/

clean: ## Remove build outputs and caches, this machine's record of runs too (keeps .venv and results/)
	rm -rf build .pytest_cache .hypothesis results/.staging
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean ## Also remove .venv
	rm -rf $(VENV)
