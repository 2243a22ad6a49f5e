"""The wheel carries everything the server needs at run time (migrations, generated code, typing
marker), and the Dockerfile builds from paths that exist and runs as a non-root, health-checked
`ctxfold serve`. No Docker engine is needed: the wheel is built the way the image's builder stage
builds it (from pyproject.toml, README/LICENSE and server/ only)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def _local_setuptools_suffices() -> bool:
    """pyproject.toml needs setuptools>=77 (PEP 639 license); with it installed the build runs offline."""
    try:
        major = int(metadata.version("setuptools").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    # The same files the Dockerfile's builder stage copies, so a stale build/ or egg-info of the
    # working tree cannot leak into (or mask something missing from) the wheel.
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "server", src / "server", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    )
    out = tmp / "wheels"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out)]
    if _local_setuptools_suffices():
        command.append("--no-build-isolation")
    result = subprocess.run([*command, str(src)], capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = list(out.glob("ctxfold-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_wheel_contains_migrations_generated_code_and_typing_marker(wheel_names: list[str]) -> None:
    names = set(wheel_names)
    for required in (
        "ctxfold/store/migrations/env.py",
        "ctxfold/store/migrations/script.py.mako",
        "ctxfold/store/migrations/alembic.ini",
        "ctxfold/v1/context_service_pb2.py",
        "ctxfold/v1/context_service_pb2.pyi",
        "ctxfold/v1/context_service_pb2_grpc.py",
        "ctxfold/py.typed",
        "ctxfold/cli.py",
        "ctxfold/server.py",
    ):
        assert required in names, f"{required} is missing from the wheel"
    initial = [n for n in names if re.fullmatch(r"ctxfold/store/migrations/versions/0001_\w+\.py", n)]
    assert initial, "the 0001 migration is missing from the wheel"
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "bench/"))]


def test_wheel_declares_the_console_script(wheel: Path, wheel_names: list[str]) -> None:
    entry_points = [n for n in wheel_names if n.endswith(".dist-info/entry_points.txt")]
    assert entry_points, "no entry_points.txt in the wheel"
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(entry_points[0]).decode()
    assert re.search(r"^ctxfold = ctxfold\.cli:main$", text, re.M), text


def _instructions() -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each Dockerfile instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_dockerfile_runs_ctxfold_serve_as_non_root_with_a_healthcheck() -> None:
    instructions = _instructions()
    users = [args for keyword, args in instructions if keyword == "USER"]
    assert users, "the Dockerfile declares no USER"
    assert users[-1].split(":")[0] not in ("root", "0"), users[-1]

    entrypoints = [args for keyword, args in instructions if keyword == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ["ctxfold", "serve"]

    healthchecks = [args for keyword, args in instructions if keyword == "HEALTHCHECK"]
    assert healthchecks, "the Dockerfile declares no HEALTHCHECK"
    command = json.loads(healthchecks[-1].split(" CMD ", 1)[1])
    assert command[1] == "-c" and "grpc_health.v1" in command[2]
    compile(command[2], "<healthcheck>", "exec")  # the inline script is valid Python

    assert ("EXPOSE", "50051") in instructions
    assert any(k == "VOLUME" and "/var/lib/ctxfold" in a for k, a in instructions)


def test_dockerfile_copies_only_existing_context_paths() -> None:
    for keyword, args in _instructions():
        if keyword != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        present = [s for s in sources if any(ROOT.glob(s.rstrip("/")))]
        missing = [s for s in sources if s not in present and "*" not in s]
        assert not missing, f"COPY {args}: {missing} not in the build context"
        assert present, f"COPY {args}: nothing to copy"


def test_the_repository_stands_alone() -> None:
    """A user clones the repository with nothing beside it: no test, benchmark, build file or doc
    reaches outside it (only `.ci/run` may use the team's folder, when it exists)."""
    outside = re.compile(r"\.\./shared|parents?\[2\] / \"shared\"|parent / \"shared\"")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    offenders = [
        name
        for name in tracked.split()
        if not name.startswith(".ci/")
        and not name.startswith("tests/data/")
        and name.endswith((".py", ".sh", ".md", ".toml", ".ts", ".go", ".java", ".json", "Makefile"))
        and outside.search((ROOT / name).read_text(errors="replace"))
    ]
    assert offenders == []
    assert (ROOT / "tests" / "data" / "traces" / "README.md").is_file()
