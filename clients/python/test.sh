#!/usr/bin/env bash
# ONE command for the Python SDK: installs what it needs from PyPI into clients/python/.venv,
# builds and installs the client (with its `test` extra, so the tests run against the installed
# package), lints (ruff), type-checks (mypy --strict), and runs pytest: unit tests, the staleness
# check of the generated code and end-to-end tests against real `ctxfold serve` subprocesses.
# Needs Python 3.11+ and the server's venv (../../.venv/bin/ctxfold, made by the root Makefile).
set -euo pipefail
cd "$(dirname "$0")"

source scripts/venv.sh

if [ ! -x ../../.venv/bin/ctxfold ]; then
  echo "../../.venv/bin/ctxfold is missing: run 'make setup' in the repository root first" >&2
  exit 1
fi

ensure_venv
echo "== install (client + test extra)"
.venv/bin/python -m pip install -q '.[test]'

echo "== ruff"
.venv/bin/ruff check src tests scripts
.venv/bin/ruff format --check src tests scripts
echo "== mypy --strict"
.venv/bin/mypy

echo "== pytest"
.venv/bin/python -m pytest "$@"
