#!/usr/bin/env bash
# Builds Jaeger v1.75.0 (all-in-one: OTLP on 4317, query API and UI on 16686) from the Go module
# proxy into DIR/bin/jaeger:
#   bash .ci/build-jaeger.sh /tmp/jaeger
#   bash .ci/jaeger.sh /tmp/jaeger/bin/jaeger          # runs it on loopback only
# About 12 minutes on 2 shared cores with a cold build cache (measured), seconds when cached.
#
# The UI: Jaeger embeds its UI from cmd/query/app/ui/actual/*.gz (go:embed); the module as
# published ships that folder empty, so a plain build serves a placeholder page and only the query
# API (/api/...) works, which is all the end-to-end test needs. To build with the real UI, set
# JAEGER_UI_ASSETS to a built jaeger-ui (its packages/jaeger-ui/build folder, or the assets.tar.gz
# of a jaeger-ui release); the script then does what Jaeger's `make build-ui` does: copies the files
# into a writable copy of the module, gzips each one, and builds against that copy.
#
# `go install …@v1.75.0` refuses the module (its go.mod has a replace directive), so this builds it
# from a throwaway module that repeats that directive.
set -euo pipefail
VERSION=v1.75.0
DIR=${1:-/tmp/ctxfold-jaeger}
UI=${JAEGER_UI_ASSETS:-}
mkdir -p "$DIR/src" "$DIR/bin"
DIR=$(cd "$DIR" && pwd)
if [ -n "$UI" ]; then UI=$(cd "$(dirname "$UI")" && pwd)/$(basename "$UI"); fi
cd "$DIR/src"
cat > go.mod <<MOD
module ctxfold.local/jaegerbuild

go 1.25

require github.com/jaegertracing/jaeger $VERSION

replace github.com/Shopify/sarama => github.com/Shopify/sarama v1.33.0
MOD
go mod download "github.com/jaegertracing/jaeger@$VERSION"
if [ -n "$UI" ]; then
  module=$(go mod download -json "github.com/jaegertracing/jaeger@$VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  rm -rf jaeger && cp -r "$module" jaeger && chmod -R u+w jaeger
  actual=jaeger/cmd/query/app/ui/actual
  if [ -d "$UI" ]; then
    cp -r "$UI"/. "$actual"/
  else
    tar -xzf "$UI" -C "$actual" --strip-components=3 packages/jaeger-ui/build
  fi
  [ -f "$actual/index.html" ] || { echo "JAEGER_UI_ASSETS has no index.html: $UI" >&2; exit 1; }
  find "$actual" -type f ! -name '*.gz' ! -name .gitignore -exec gzip --no-name {} +
  echo "replace github.com/jaegertracing/jaeger => ./jaeger" >> go.mod
else
  echo "build-jaeger: no JAEGER_UI_ASSETS: the UI at :16686 will be a placeholder (the query API works)" >&2
fi
go get "github.com/jaegertracing/jaeger/cmd/jaeger@$VERSION"
go build -o "$DIR/bin/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
echo "$DIR/bin/jaeger"
