"""Regenerates the committed Python code for the ctxfold API from proto/.

    python proto/generate.py            # writes server/ctxfold/v1/
    python proto/generate.py --out DIR  # writes DIR/ctxfold/v1/ (the staleness test compares the two)

Uses grpcio-tools (protoc + the gRPC Python plugin) and mypy-protobuf for typed stubs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
SERVER_OUT = ROOT / "server"
PACKAGE = Path("ctxfold") / "v1"


def proto_files() -> list[str]:
    return sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / PACKAGE).glob("*.proto"))


def generate_python(out_root: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    target = out_root / PACKAGE
    if target.exists():
        for stale in target.glob("*_pb2*"):
            stale.unlink()
    target.mkdir(parents=True, exist_ok=True)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    plugin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={shutil.which('protoc-gen-mypy', path=str(plugin_dir))}",
        f"--plugin=protoc-gen-mypy_grpc={shutil.which('protoc-gen-mypy_grpc', path=str(plugin_dir))}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out=quiet:{out_root}",
        f"--mypy_grpc_out=quiet:{out_root}",
        *proto_files(),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    (target / "__init__.py").write_text('"""Generated from proto/ctxfold/v1 by proto/generate.py. Do not edit."""\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=SERVER_OUT, help="output root for Python code")
    args = parser.parse_args()
    generate_python(args.out)


if __name__ == "__main__":
    main()
