#!/usr/bin/env bash
# Starts a private PostgreSQL cluster on loopback for the test suite and prints its URL.
# Installs Debian's postgresql when it is missing (as root). Idempotent: reuses a running cluster.
#   eval "$(bash .ci/postgres.sh)"   # exports CTXFOLD_TEST_POSTGRES_URL
set -euo pipefail
PORT=${CTXFOLD_PG_PORT:-55432}
DIR=${CTXFOLD_PG_DIR:-/tmp/ctxfold-pg}

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "echo 'PostgreSQL is not installed and this user cannot install it; PostgreSQL tests will be skipped' >&2"
    exit 0
  fi
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) >&2
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi

run() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if ! run "$bindir/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
  if [ ! -f "$DIR/PG_VERSION" ]; then
    mkdir -p "$DIR"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$DIR"
    run "$bindir/initdb" -D "$DIR" -U ctxfold --auth=trust -E UTF8 >/dev/null
  fi
  run "$bindir/pg_ctl" -D "$DIR" -l "$DIR/server.log" -w -o "-p $PORT -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" start >/dev/null
fi
echo "export CTXFOLD_TEST_POSTGRES_URL=postgresql://ctxfold@127.0.0.1:$PORT/postgres"
