#!/usr/bin/env bash
# Regenerates the committed Go code for proto/ctxfold/v1 into clients/go/ctxfoldv1/.
#
#   clients/go/generate.sh           # writes clients/go/ctxfoldv1/*.pb.go, then ctxfold/enums_gen.go
#   clients/go/generate.sh OUT_DIR   # writes OUT_DIR/ctxfoldv1/*.pb.go (the staleness test compares)
#   clients/go/generate.sh --tools   # only installs the plugins into clients/go/tools/bin
#
# Everything it needs is installed by the script itself: protoc-gen-go and protoc-gen-go-grpc
# with `go install` from the Go module proxy into clients/go/tools/bin (pinned versions below),
# and buf from npm (`npm ci` at the repo root when node_modules/.bin/buf is missing).
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TOOLS="$HERE/tools/bin"

install_tool() { # name module version
  local name=$1 module=$2 version=$3 stamp="$TOOLS/.$1.version"
  if [[ -x "$TOOLS/$name" && -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
    return
  fi
  mkdir -p "$TOOLS"
  echo "generate.sh: installing $module@$version into tools/bin" >&2
  # Outside the clients/go module, so its go.mod is neither read nor changed.
  (cd "$TOOLS" && GOBIN="$TOOLS" GOFLAGS=-mod=mod GOWORK=off go install "$module@$version")
  echo "$version" >"$stamp"
}

install_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
install_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"

if [[ "${1:-}" == "--tools" ]]; then
  exit 0
fi

BUF="$ROOT/node_modules/.bin/buf"
if [[ ! -x "$BUF" ]]; then
  echo "generate.sh: buf missing; running npm ci at the repo root" >&2
  (cd "$ROOT" && npm ci --no-audit --no-fund >&2)
fi

OUT="${1:-$HERE}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
rm -f "$OUT"/ctxfoldv1/*.pb.go

cd "$ROOT"
PATH="$TOOLS:$PATH" "$BUF" generate proto --template "$HERE/buf.gen.yaml" --output "$OUT"
echo "generate.sh: wrote $(cd "$OUT" && ls ctxfoldv1/*.pb.go | tr '\n' ' ')" >&2
if [[ "$OUT" == "$HERE" ]]; then
  # The enums re-exported in package ctxfold follow the generated ones.
  (cd "$HERE/ctxfold" && go generate)
  echo "generate.sh: wrote ctxfold/enums_gen.go" >&2
fi
