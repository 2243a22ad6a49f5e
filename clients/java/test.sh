#!/usr/bin/env bash
# The Java client's one test command: fetches what it needs from Maven Central (protoc,
# protobuf-java, grpc-java, JUnit, ... into ~/.m2 and clients/java/.tools), checks that the
# committed generated code is up to date, builds, and runs every test (unit, in-process, and the
# end-to-end tests against a real `ctxfold serve` started from ../../.venv/bin/ctxfold).
#
#   clients/java/test.sh [extra mvn args, e.g. -Dtest=EndToEndTest]
#
# Needs Java 17+ and Maven 3.8+; the repository's .venv (make setup) provides the server.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$HERE"

for tool in java mvn; do
  command -v "$tool" >/dev/null || { echo "test.sh: $tool is not installed" >&2; exit 1; }
done
SERVER="$ROOT/.venv/bin/ctxfold"
if [ ! -x "$SERVER" ]; then
  echo "test.sh: $SERVER is missing; create the repository's .venv first (make setup)" >&2
  exit 1
fi

echo "== staleness: regenerating from proto/ into a temp dir"
./generate.sh --check

echo "== build and test"
# Debian's Maven 3.8 writes stray ANSI resets (ESC[0m) even in batch mode; strip them so the
# Surefire summary stays the output's closing lines. pipefail keeps Maven's exit status.
mvn -B -ntp -Dstyle.color=never test "$@" 2>&1 | sed -u -e 's/\x1b\[[0-9;]*m//g'
