# The two commands of the README:
#   make serve   set up and start ctxfold on its embedded default (SQLite + extractive summarizer)
#   make test    set up and run the whole test suite (PostgreSQL, lint, types, proto lint, contract)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SHARED ?= ../shared

.PHONY: setup serve test check pytest generate

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

setup: $(VENV)/.installed node_modules/.installed

serve: $(VENV)/.installed
	$(VENV)/bin/ctxfold serve

generate: setup
	$(PY) proto/generate.py

check: setup
	$(VENV)/bin/ruff check server tests bench proto
	$(VENV)/bin/ruff format --check server tests bench proto
	$(VENV)/bin/mypy
	npx --no-install buf lint
	$(PY) $(SHARED)/tools/contract_check.py --proto-dir proto

pytest: setup
	eval "$$(bash .ci/postgres.sh)" && $(PY) -m pytest -q -ra

test: check pytest
