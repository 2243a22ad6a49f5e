#!/usr/bin/env bash
# One command for the TypeScript client: install dependencies (npm ci from package-lock.json,
# and the repository root's buf when missing), build with tsc, then run every test with node's
# test runner: unit tests, the staleness check of the generated code (regenerates into a temp
# dir and compares bytes), and the end-to-end tests against a real ctxfold server
# (<repo>/.venv/bin/ctxfold, or $CTXFOLD_BIN). Exits non-zero on any failure.
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
./node_modules/.bin/tsc -p tsconfig.json

node --test --test-reporter=spec dist/test/*.test.js
