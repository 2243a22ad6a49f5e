#!/usr/bin/env bash
# One command for the Go client: installs what it needs, checks `gofmt -l` and `go vet`, checks that
# the committed generated code (ctxfoldv1, ctxfold/enums_gen.go) is fresh, and runs every test: unit,
# the conformance scenarios, end-to-end and the consumer project (a temp module outside the repo
# using the SDK through a replace directive), against a real `ctxfold serve`
# (../../.venv/bin/ctxfold, which the root Makefile creates; override with CTXFOLD_BIN). Exits
# non-zero on any failure.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$HERE"

# Dependencies from the Go module proxy (checked against go.sum); the generator's plugins and buf.
go mod download
bash ./generate.sh --tools
if [[ ! -x "$ROOT/node_modules/.bin/buf" ]]; then
  (cd "$ROOT" && npm ci --no-audit --no-fund)
fi

if [[ -z "${CTXFOLD_BIN:-}" && ! -x "$ROOT/.venv/bin/ctxfold" ]]; then
  echo "test.sh: $ROOT/.venv/bin/ctxfold is missing (make setup at the repo root creates it)" >&2
  exit 1
fi

unformatted="$(gofmt -l .)"
if [[ -n "$unformatted" ]]; then
  echo "test.sh: not gofmt-formatted:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...

# The race detector needs cgo and a C compiler; without them the tests run without it.
race=()
if [[ "$(go env CGO_ENABLED)" == 1 ]] && command -v "$(go env CC)" >/dev/null 2>&1; then
  race=(-race)
fi

export CTXFOLD_REQUIRE_SERVER=1 CTXFOLD_REQUIRE_GENERATE=1
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
go test -count=1 "${race[@]}" -timeout 10m -v ./... "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed=$(grep -cE '^ *--- PASS' "$log" || true)
failed=$(grep -cE '^ *--- FAIL' "$log" || true)
skipped=$(grep -cE '^ *--- SKIP' "$log" || true)
echo "go: $passed passed, $failed failed, $skipped skipped"
exit "$status"
