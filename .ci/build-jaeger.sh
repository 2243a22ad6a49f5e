#!/usr/bin/env bash
# Builds Jaeger (all-in-one: OTLP on 4317, query API and UI on 16686) from the Go module proxy into
# DIR/bin/jaeger, for the opt-in end-to-end trace test:
#   bash .ci/build-jaeger.sh /tmp/jaeger && CTXFOLD_JAEGER_BIN=/tmp/jaeger/bin/jaeger make pytest
# `go install …@v1.76.0` refuses the module (its go.mod has a replace directive), so this builds it
# from a throwaway module that repeats that directive.
set -euo pipefail
VERSION=v1.76.0
DIR=${1:-/tmp/ctxfold-jaeger}
mkdir -p "$DIR/src" "$DIR/bin"
cd "$DIR/src"
cat > go.mod <<MOD
module ctxfold.local/jaegerbuild

go 1.25

require github.com/jaegertracing/jaeger $VERSION

replace github.com/Shopify/sarama => github.com/Shopify/sarama v1.33.0
MOD
go get "github.com/jaegertracing/jaeger/cmd/jaeger@$VERSION"
go build -o "$DIR/bin/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
echo "$DIR/bin/jaeger"
