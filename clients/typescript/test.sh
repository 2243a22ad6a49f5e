#!/usr/bin/env bash
# One command for the TypeScript SDK: install dependencies (npm ci from package-lock.json, and the
# repository root's buf when missing), build (ESM and CommonJS), then run every test with node's
# test runner against real ctxfold servers (<repo>/.venv/bin/ctxfold, or $CTXFOLD_BIN): unit
# tests, the conformance scenarios, end-to-end tests, the staleness check of the generated code,
# and the consumer project (npm pack, installed into a temp dir outside the repository, the
# README agent loop compiled and run there). Exits non-zero on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$HERE"

node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
  echo "test.sh: Node.js >= 20 is required (found $(node --version))" >&2
  exit 1
fi

# npm ci when node_modules is missing or older than the lockfile.
needs_ci() {
  local dir="$1"
  [ ! -f "$dir/node_modules/.package-lock.json" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]
}
if needs_ci "$HERE"; then
  npm ci --no-audit --no-fund
fi
if [ ! -x "$ROOT/node_modules/.bin/buf" ]; then
  (cd "$ROOT" && npm ci --no-audit --no-fund)
fi

export CTXFOLD_BIN="${CTXFOLD_BIN:-$ROOT/.venv/bin/ctxfold}"
if [ ! -x "$CTXFOLD_BIN" ]; then
  echo "test.sh: $CTXFOLD_BIN not found: create the server's virtualenv first (make setup at the repo root)" >&2
  exit 1
fi

rm -rf dist
npm run build --silent

node --test --test-reporter=spec dist/esm/test/*.test.js
