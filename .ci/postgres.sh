#!/usr/bin/env bash
# A private PostgreSQL cluster on loopback for the test suite. Installs Debian's postgresql when it
# is missing (as root). Two ways to use it:
#   eval "$(bash .ci/postgres.sh)"        # start (or reuse) the cluster; exports CTXFOLD_TEST_POSTGRES_URL
#   bash .ci/postgres.sh -- CMD ARGS...   # the same, runs CMD with the URL set, then stops and removes
#                                         # the cluster if this call started it (what `make test` does)
set -euo pipefail
PORT=${CTXFOLD_PG_PORT:-55432}
# In /tmp rather than the checkout: the server runs as the postgres user, which may not reach it.
DIR=${CTXFOLD_PG_DIR:-/tmp/ctxfold-pg}
URL="postgresql://ctxfold@127.0.0.1:$PORT/postgres"

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "PostgreSQL is not installed and this user cannot install it; PostgreSQL tests will be skipped" >&2
    if [ "${1:-}" = "--" ]; then shift; exec "$@"; fi
    exit 0
  fi
  echo "installing Debian's postgresql for the PostgreSQL tests" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) >&2
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi

run() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

started=""
if ! run "$bindir/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
  created=""
  if [ ! -f "$DIR/PG_VERSION" ]; then
    mkdir -p "$DIR"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$DIR"
    run "$bindir/initdb" -D "$DIR" -U ctxfold --auth=trust -E UTF8 >/dev/null
    created=1
  fi
  # The socket lives in the data folder, so stopping and removing the folder leaves nothing behind.
  run "$bindir/pg_ctl" -D "$DIR" -l "$DIR/server.log" -w -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" start >/dev/null
  started=${created:-kept}
fi

if [ "${1:-}" != "--" ]; then
  echo "export CTXFOLD_TEST_POSTGRES_URL=$URL"
  exit 0
fi
shift
if [ -n "$started" ]; then
  echo "started a private PostgreSQL on 127.0.0.1:$PORT for this run (stopped at the end)" >&2
  # The trap's last status becomes the script's, so stop() must always succeed.
  stop() {
    run "$bindir/pg_ctl" -D "$DIR" -m fast -w stop >/dev/null || true
    if [ "$started" = 1 ]; then rm -rf "$DIR"; fi
  }
  trap stop EXIT
fi
status=0
CTXFOLD_TEST_POSTGRES_URL=$URL "$@" || status=$?
exit "$status"
