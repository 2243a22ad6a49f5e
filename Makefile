# The two commands of the README:
#   make serve   set up and start ctxfold on its embedded default (SQLite + extractive summarizer)
#   make test    set up and run the whole test suite: lint, types, proto lint, the
#                server tests on SQLite and PostgreSQL, and the four client SDKs against a real server
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup serve test check pytest clients generate

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

setup: $(VENV)/.installed node_modules/.installed

serve: $(VENV)/.installed
	$(VENV)/bin/ctxfold serve

# Regenerates every committed generated file from proto/ (server, then each client SDK).
generate: setup
	$(PY) proto/generate.py
	bash clients/go/generate.sh
	bash clients/typescript/generate.sh
	bash clients/java/generate.sh
	bash clients/python/generate.sh

check: setup
	$(VENV)/bin/ruff check server tests bench proto
	$(VENV)/bin/ruff format --check server tests bench proto
	$(VENV)/bin/mypy
	npx --no-install buf lint

pytest: setup
	eval "$$(bash .ci/postgres.sh)" && $(PY) -m pytest -q -ra

clients: setup
	bash clients/python/test.sh
	bash clients/typescript/test.sh
	bash clients/go/test.sh
	bash clients/java/test.sh

test: check pytest clients
