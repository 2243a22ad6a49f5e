#!/usr/bin/env bash
# The Java client's one test command: fetches what it needs from Maven Central (protoc,
# protobuf-java, grpc-java, JUnit, ... into ~/.m2 and clients/java/.tools), checks that the
# committed generated code is up to date, builds a consumer project outside the repository the way
# README.md's "Use it from your project" says (with the root README's Java program, compiled) and
# runs the README's agent loop with it against a real server, then builds and runs every test (unit, in-process, conformance scenarios, and the
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

# Debian's Maven 3.8 writes stray ANSI resets (ESC[0m) even in batch mode; strip them so the
# Surefire summary stays the output's closing lines. pipefail keeps Maven's exit status.
mvn_plain() { mvn -B -ntp -Dstyle.color=never "$@" 2>&1 | sed -u -e 's/\x1b\[[0-9;]*m//g'; }

echo "== staleness: regenerating from proto/ into a temp dir"
./generate.sh --check

echo "== consumer project: install the SDK into a temporary repository, build README's pom outside the repo"
WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
VERSION="$(tr -d '[:space:]' <"$ROOT/VERSION")"
# A fresh local repository, so the consumer resolves the SDK only from what `mvn install` put
# there; everything else is read from ~/.m2 (as a file repository) before Maven Central.
cat >"$WORK/settings.xml" <<XML
<settings>
  <localRepository>$WORK/m2</localRepository>
  <profiles><profile><id>user-cache</id>
    <repositories><repository><id>user-cache</id><url>file://$HOME/.m2/repository</url></repository></repositories>
    <pluginRepositories><pluginRepository><id>user-cache</id><url>file://$HOME/.m2/repository</url></pluginRepository></pluginRepositories>
  </profile></profiles>
  <activeProfiles><activeProfile>user-cache</activeProfile></activeProfiles>
</settings>
XML
mvn_plain -q -s "$WORK/settings.xml" -DskipTests install
for classifier in "" -sources -javadoc; do
  jar="$WORK/m2/dev/ctxfold/ctxfold-client/$VERSION/ctxfold-client-$VERSION$classifier.jar"
  [ -s "$jar" ] || { echo "test.sh: $jar was not installed" >&2; exit 1; }
done
# The consumer pom is README.md's, verbatim (the block after the consumer-pom marker).
mkdir -p "$WORK/consumer/src/main/java"
awk '/<!-- consumer-pom -->/{found=1; next} found && /^```xml/{inside=1; next} inside && /^```/{exit} inside{print}' \
  README.md >"$WORK/consumer/pom.xml"
grep -q "<version>$VERSION</version>" "$WORK/consumer/pom.xml" \
  || { echo "test.sh: README.md's consumer pom does not depend on version $VERSION" >&2; exit 1; }
# The program is README.md's agent loop block, which must be examples/AgentLoop.java verbatim.
awk '/<!-- agent-loop -->/{found=1; next} found && /^```java/{inside=1; next} inside && /^```/{exit} inside{print}' \
  README.md >"$WORK/consumer/src/main/java/AgentLoop.java"
diff -u examples/AgentLoop.java "$WORK/consumer/src/main/java/AgentLoop.java" \
  || { echo "test.sh: README.md's agent loop differs from examples/AgentLoop.java" >&2; exit 1; }
# The root README's Java program (it calls OpenAI: compiled with the consumer, not run).
awk '/^### Java$/{found=1; next} found && /^```java/{inside=1; next} inside && /^```/{exit} inside{print}' \
  "$ROOT/README.md" >"$WORK/consumer/src/main/java/Agent.java"
[ -s "$WORK/consumer/src/main/java/Agent.java" ] || { echo "test.sh: no Java program under ### Java in README.md" >&2; exit 1; }
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
OTEL_SDK_DISABLED=true "$SERVER" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" --log-level WARNING \
  >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.2
done
(cd "$WORK/consumer" && mvn_plain -q -s "$WORK/settings.xml" compile exec:java \
  -Dexec.args="$ROOT/clients/conformance/fixtures/agent_trace.json 127.0.0.1:$PORT") >"$WORK/agent.log"
# On the trace the loop folds at least once and reads at least once (clients/README.md).
summary="$(tail -n 1 "$WORK/agent.log")"
if ! grep -q "fold FOLD_STAGE_PASS_COMMITTED" "$WORK/agent.log" \
    || ! [[ "$summary" =~ ^[0-9]+\ model\ calls,\ [1-9][0-9]*\ folds,\ [1-9][0-9]*\ read_tool_result\ calls ]]; then
  cat "$WORK/agent.log" "$WORK/server.log" >&2
  echo "test.sh: the README agent loop did not fold and read as it should" >&2
  exit 1
fi
echo "agent loop: $summary"
kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""

echo "== build and test"
mvn_plain test "$@"
