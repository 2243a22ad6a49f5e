#!/usr/bin/env bash
# Regenerates the TypeScript code of the ctxfold API into src/gen (one command).
#
#   ./generate.sh            regenerate src/gen in place
#   ./generate.sh OUT_DIR    generate into OUT_DIR/src/gen instead (used by the staleness check)
#
# Tools come from registries only: protoc-gen-es and google-proto-files from this package's
# package-lock.json (npm ci into ./node_modules), buf from the repository root's package-lock.json.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT_BASE="${1:-$HERE}"
mkdir -p "$OUT_BASE"
OUT_BASE="$(cd "$OUT_BASE" && pwd)"
cd "$HERE"

# npm ci when node_modules is missing or older than the lockfile.
needs_ci() {
  local dir="$1"
  [ ! -f "$dir/node_modules/.package-lock.json" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]
}
if needs_ci "$HERE" || [ ! -x "$HERE/node_modules/.bin/protoc-gen-es" ]; then
  (cd "$HERE" && npm ci --no-audit --no-fund >&2)
fi
BUF="$ROOT/node_modules/.bin/buf"
if [ ! -x "$BUF" ]; then
  (cd "$ROOT" && npm ci --no-audit --no-fund >&2)
fi

# Stage the two google/rpc protos the error details need (google.rpc.Status, google.rpc.ErrorInfo).
STAGE="$HERE/.gen/googleapis"
rm -rf "$STAGE"
mkdir -p "$STAGE/google/rpc"
cp "$HERE/node_modules/google-proto-files/google/rpc/status.proto" \
   "$HERE/node_modules/google-proto-files/google/rpc/error_details.proto" "$STAGE/google/rpc/"

rm -rf "$OUT_BASE/src/gen"
"$BUF" generate --template "$HERE/buf.gen.yaml" --output "$OUT_BASE"
echo "generated $(find "$OUT_BASE/src/gen" -name '*.ts' | wc -l) files into $OUT_BASE/src/gen" >&2
