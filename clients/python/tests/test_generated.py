"""The generated code: fresh (regenerating gives byte-identical files), isolated from the server
package `ctxfold`, and what the installed package ships."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import ctxfold_client
from conftest import CLIENT_DIR, REPO_ROOT
from ctxfold_client import pb

COMMITTED = CLIENT_DIR / "src" / "ctxfold_client" / "_gen"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    subprocess.run([sys.executable, str(CLIENT_DIR / "scripts" / "generate.py"), "--out", str(out)], check=True)
    fresh, committed = _files(out), _files(COMMITTED)
    assert sorted(fresh) == sorted(committed), "generated file set differs: run ./generate.sh"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated files {stale}: run clients/python/generate.sh"


def test_installed_package_ships_the_committed_code() -> None:
    installed = Path(ctxfold_client.__file__).parent
    assert "site-packages" in installed.parts, "the tests must run against the installed package"
    assert _files(installed / "_gen") == _files(COMMITTED)
    assert (installed / "py.typed").exists()


def test_generated_code_is_isolated_from_the_server_package() -> None:
    assert pb.Message.__module__ == "ctxfold_client._gen.context_service_pb2"
    assert pb.DESCRIPTOR.name == "ctxfold/v1/context_service.proto"
    assert pb.DESCRIPTOR.package == "ctxfold.v1"
    probe = (
        "import sys, ctxfold_client, ctxfold_client.aio\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ctxfold'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    for path in COMMITTED.iterdir():
        if path.suffix in {".py", ".pyi"}:
            assert not re.search(r"^\s*(from|import) ctxfold\b(?!_)", path.read_text(), re.M), path.name


def test_generator_pins_match_the_server() -> None:
    server = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    client = tomllib.loads((CLIENT_DIR / "pyproject.toml").read_text())
    script = (CLIENT_DIR / "generate.sh").read_text()
    for tool in ("grpcio-tools", "mypy-protobuf"):
        (server_pin,) = [d for d in server["project"]["optional-dependencies"]["dev"] if d.startswith(tool + "==")]
        assert server_pin in client["project"]["optional-dependencies"]["test"]
        assert server_pin in script
        assert metadata.version(tool) == server_pin.split("==")[1]
