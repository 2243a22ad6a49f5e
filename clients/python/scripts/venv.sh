# Sourced by generate.sh and test.sh: makes sure clients/python/.venv exists (Python 3.11+).
pick_python() {
  for candidate in "${PYTHON:-}" python3 python3.11 python3.12 python3.13; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  echo "Python 3.11+ is required (set PYTHON=/path/to/python3.11)" >&2
  return 1
}

ensure_venv() {
  if [ ! -x .venv/bin/python ]; then
    local python
    python=$(pick_python)
    "$python" -m venv .venv
  fi
}
