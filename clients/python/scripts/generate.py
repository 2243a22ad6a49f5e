"""Generates ctxfold_client/_gen from ../../proto with grpcio-tools (protoc) and mypy-protobuf.

    python scripts/generate.py            # writes src/ctxfold_client/_gen/
    python scripts/generate.py --out DIR  # writes DIR/ (the staleness test compares the two)

protoc emits modules named after the proto package (`ctxfold.v1`). The server package `ctxfold`
ships those very module names, so the client's copies are moved to `ctxfold_client._gen` and their
imports rewritten; every rewrite is checked so that a changed generator fails loudly here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PROTO_DIR = HERE.parent.parent / "proto"
DEFAULT_OUT = HERE / "src" / "ctxfold_client" / "_gen"
PROTO_PACKAGE = Path("ctxfold") / "v1"
TARGET_MODULE = "ctxfold_client._gen"

# (file suffix, old text, new text, expected number of replacements)
REWRITES: list[tuple[str, str, str, int]] = [
    (
        "_pb2.py",
        "'ctxfold.v1.context_service_pb2'",
        f"'{TARGET_MODULE}.context_service_pb2'",
        1,
    ),
    (
        "_pb2_grpc.py",
        "from ctxfold.v1 import context_service_pb2 ",
        f"from {TARGET_MODULE} import context_service_pb2 ",
        1,
    ),
    (
        "_pb2_grpc.pyi",
        "from ctxfold.v1 import context_service_pb2 ",
        f"from {TARGET_MODULE} import context_service_pb2 ",
        1,
    ),
]

INIT = '"""Generated from proto/ctxfold/v1 by clients/python/generate.sh. Do not edit."""\n'


def _plugin(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install mypy-protobuf into this Python ({sys.executable})")
    return found


def generate(out: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / PROTO_PACKAGE).glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_DIR}",
            f"-I{well_known}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out=quiet:{tmp}",
            f"--mypy_grpc_out=quiet:{tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        produced = sorted((Path(tmp) / PROTO_PACKAGE).iterdir())
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("*_pb2*"):
            stale.unlink()
        for path in produced:
            text = path.read_text(encoding="utf-8")
            for suffix, old, new, expected in REWRITES:
                if path.name.endswith(suffix):
                    count = text.count(old)
                    if count != expected:
                        raise SystemExit(f"{path.name}: expected {expected}x {old!r}, found {count}")
                    text = text.replace(old, new)
            if "ctxfold.v1 import" in text or "import ctxfold.v1" in text:
                raise SystemExit(f"{path.name}: an import of ctxfold.v1 was left unrewritten")
            (out / path.name).write_text(text, encoding="utf-8", newline="\n")
    (out / "__init__.py").write_text(INIT, encoding="utf-8", newline="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    args = parser.parse_args()
    os.umask(0o022)
    generate(args.out)


if __name__ == "__main__":
    main()
