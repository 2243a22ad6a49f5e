# The two commands of the README:
#   make serve   install the server alone and start ctxfold on its embedded default (SQLite + the
#                extractive summarizer) on 127.0.0.1:50051, with the HTTP gateway on 127.0.0.1:8080
#   make test    set up and run the whole test suite: lint, types, proto lint, the
#                server tests on SQLite and PostgreSQL, and the four client SDKs against a real server.
#                It leaves nothing running (a PostgreSQL it started is stopped) and keeps its
#                temporary files in .cache/tmp (gitignored), not in /tmp.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TEST_TMP := $(CURDIR)/.cache/tmp

.PHONY: setup serve test check pytest clients generate test-tmp

# The server alone (no dev or bench extras): what `make serve` needs. Both installs take the image's
# pins (constraints.txt, every runtime dependency), so `make serve`, the tests and the image run the same versions.
# The gateway reaches the server through the Python SDK, installed from clients/python beside it.
$(VENV)/.installed-server: pyproject.toml VERSION clients/python/pyproject.toml constraints.txt
	@echo "make serve: installing ctxfold and its server dependencies into $(VENV) (first run: about a minute)"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q -U pip
	@$(PY) -m pip install -q --constraint constraints.txt -e ./clients/python -e .
	@touch $@

# Everything the tests, linters and benchmarks need (a superset of the server's).
$(VENV)/.installed: pyproject.toml VERSION clients/python/pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q --constraint constraints.txt -e ./clients/python -e '.[dev,bench]'
	touch $@ $(VENV)/.installed-server

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

setup: $(VENV)/.installed node_modules/.installed

serve: $(VENV)/.installed-server
	@echo "make serve: starting ctxfold on 127.0.0.1:50051 and its gateway on http://127.0.0.1:8080 (SQLite in $${XDG_DATA_HOME:-$$HOME/.local/share}/ctxfold; Ctrl-C stops both)"
	@$(VENV)/bin/ctxfold serve --gateway-listen 127.0.0.1:8080

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

# A fresh temporary folder for each test run, inside the checkout.
test-tmp:
	rm -rf $(TEST_TMP) && mkdir -p $(TEST_TMP)

pytest: setup
	bash .ci/postgres.sh -- $(PY) -m pytest -q -ra

clients: setup
	bash clients/python/test.sh
	bash clients/typescript/test.sh
	bash clients/go/test.sh
	bash clients/java/test.sh

# Everything `make test` runs puts its temporary files under TEST_TMP.
test: export TMPDIR = $(TEST_TMP)
test: test-tmp check pytest clients
