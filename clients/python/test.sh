#!/usr/bin/env bash
# ONE command for the Python SDK: installs what it needs from PyPI into clients/python/.venv,
# builds and installs the client (with its `test` extra, so the tests run against the installed
# package), lints (ruff), type-checks (mypy --strict), checks that the root README's Python snippet
# is a complete program, runs pytest (unit tests, the staleness checks of the generated code, the
# conformance scenarios and end-to-end tests against real `ctxfold serve` subprocesses), and finally
# uses the SDK as a newcomer would: builds the wheel, installs it into a fresh venv of a temporary
# project OUTSIDE the repository and runs the README's agent loop there against a real server.
# Needs Python 3.11+ and the server's venv (../../.venv/bin/ctxfold, made by the root Makefile).
set -euo pipefail
cd "$(dirname "$0")"

source scripts/venv.sh

CTXFOLD=$(pwd)/../../.venv/bin/ctxfold
if [ ! -x "$CTXFOLD" ]; then
  echo "../../.venv/bin/ctxfold is missing: run 'make setup' in the repository root first" >&2
  exit 1
fi

ensure_venv
echo "== install (client + test extra)"
.venv/bin/python -m pip install -q '.[test]'

echo "== ruff"
.venv/bin/ruff check src tests scripts
.venv/bin/ruff format --check src tests scripts
echo "== mypy --strict"
.venv/bin/mypy

echo "== the root README's Python snippet: a complete program (ruff finds every name it uses defined)"
snippet=$(mktemp --suffix=.py)
awk '/^### Python$/{f=1; next} f && /^```python$/{i=1; next} i && /^```$/{exit} i{print}' ../../README.md >"$snippet"
[ -s "$snippet" ] || { echo "no Python snippet under '### Python' in ../../README.md" >&2; exit 1; }
.venv/bin/ruff check --no-cache --isolated --select F,E9 "$snippet"
rm -f "$snippet"

echo "== pytest"
.venv/bin/python -m pytest "$@"

echo "== consumer project outside the repository (README: Use it from your project)"
work=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
.venv/bin/python -m pip wheel -q --no-deps . -w "$work/dist"
mkdir "$work/project"
python=$(pick_python)
"$python" -m venv "$work/project/.venv"
"$work/project/.venv/bin/python" -m pip install -q "$work"/dist/ctxfold_client-*.whl
# the README's agent loop, exactly as the README shows it
"$work/project/.venv/bin/python" - README.md "$work/project/agent_loop.py" <<'EOF'
import sys
readme, target = sys.argv[1], sys.argv[2]
block = open(readme, encoding="utf-8").read().split("<!-- agent-loop -->\n```python\n", 1)[1].split("```", 1)[0]
open(target, "w", encoding="utf-8").write(block)
EOF
cp ../conformance/fixtures/agent_trace.json "$work/project/"
"$CTXFOLD" serve --listen 127.0.0.1:0 --data-dir "$work/data" >"$work/server.log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's/.*serving on [^ ]*:\([0-9][0-9]*\) (.*/\1/p' "$work/server.log" | head -1)  # "serving on HOST:PORT (…)"
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "ctxfold did not start" >&2; cat "$work/server.log" >&2; exit 1; }
(cd "$work/project" && .venv/bin/python agent_loop.py agent_trace.json "127.0.0.1:$port") | tee "$work/run.log"
grep -q "fold FOLD_STAGE_PASS_COMMITTED" "$work/run.log"
grep -Eq " [1-9][0-9]* folds, [1-9][0-9]* read_tool_result calls" "$work/run.log"
echo "== consumer project: OK"
