#!/usr/bin/env bash
# Regenerates src/ctxfold_client/_gen from ../../proto. ONE command; needs nothing but Python 3.11+:
# it installs the pinned generators (grpcio-tools = protoc + the gRPC plugin, and mypy-protobuf for
# typed .pyi stubs) from PyPI into clients/python/.venv, which this folder controls.
#   ./generate.sh             # write src/ctxfold_client/_gen
#   ./generate.sh --out DIR   # write DIR instead (the staleness test compares the two)
set -euo pipefail
cd "$(dirname "$0")"
# Keep these pins equal to the server's (../../pyproject.toml) and to the `test` extra of
# pyproject.toml; tests/test_generated.py checks all three agree.
GENERATORS=(grpcio-tools==1.85.1 mypy-protobuf==5.1.0)
source scripts/venv.sh
ensure_venv
.venv/bin/python -m pip install -q "${GENERATORS[@]}"
exec .venv/bin/python scripts/generate.py "$@"
