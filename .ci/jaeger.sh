#!/usr/bin/env bash
# Runs a Jaeger all-in-one binary (from .ci/build-jaeger.sh) with every port on loopback: its
# default configuration binds the query API and UI (16686, 16685) to all interfaces.
#   bash .ci/jaeger.sh /tmp/jaeger/bin/jaeger
set -euo pipefail
exec "${1:?usage: jaeger.sh PATH/TO/jaeger}" \
  --set=extensions.jaeger_query.http.endpoint=127.0.0.1:16686 \
  --set=extensions.jaeger_query.grpc.endpoint=127.0.0.1:16685
