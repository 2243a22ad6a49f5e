"""The wheel carries everything the server needs at run time (migrations, generated code, typing
marker), and the Dockerfile builds from paths that exist and runs as a non-root, health-checked
`ctxfold serve`. No Docker engine is needed: the wheel is built the way the image's builder stage
builds it (from pyproject.toml, README/LICENSE and server/ only)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import free_port
from ctxfold import cli
from ctxfold.healthcheck import check_target, served_settings
from test_cli import clean_environ, ctxfold_command, serving

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
    for name in ("pyproject.toml", "README.md", "LICENSE", "VERSION"):
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
    # `ctxfold healthcheck` follows the server's flags, config and environment (tested below).
    assert json.loads(healthchecks[-1].split(" CMD ", 1)[1])[:2] == ["ctxfold", "healthcheck"]

    assert ("EXPOSE", "50051") in instructions
    assert any(k == "VOLUME" and "/var/lib/ctxfold" in a for k, a in instructions)


def test_dockerfile_copies_only_existing_context_paths() -> None:
    for keyword, args in _instructions():
        if keyword != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        assert not [s for s in sources if "*" in s], f"COPY {args}: a wildcard copies nothing when the file is gone"
        missing = [s for s in sources if not (ROOT / s.rstrip("/")).exists()]
        assert not missing, f"COPY {args}: {missing} not in the repository"
        ignored = [s for s in sources if dockerignored(s.rstrip("/"))]
        assert not ignored, f"COPY {args}: {ignored} are excluded by .dockerignore"


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


# ---- .dockerignore --------------------------------------------------------------------------------


def _dockerignore_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over slash-separated paths;
    like Docker, a pattern also matches everything below a matching folder."""
    out = ""
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out, index = out + "(?:.*/)?", index + 3
        elif pattern.startswith("**", index):
            out, index = out + ".*", index + 2
        elif pattern[index] == "*":
            out, index = out + "[^/]*", index + 1
        elif pattern[index] == "?":
            out, index = out + "[^/]", index + 1
        else:
            out, index = out + re.escape(pattern[index]), index + 1
    return re.compile(out + "(?:/.*)?")


def dockerignored(path: str) -> bool:
    """Whether the build context leaves `path` out: the last matching line decides, `!` re-includes."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        if _dockerignore_pattern(pattern).fullmatch(path):
            excluded = not negated
    return excluded


@pytest.mark.parametrize(
    "path",
    [
        "clients/go/tools/bin/protoc-gen-go",
        "clients/java/.tools/protoc/bin/protoc",
        "clients/python/.venv/bin/python",
        "clients/typescript/node_modules/x/index.js",
        "node_modules/@bufbuild/buf/bin/buf",
        ".venv/bin/python",
        ".cache/tmp/pytest-of-root/x",
        ".git/HEAD",
        "tests/test_cli.py",
        "bench/results/replay.json",
        "server/ctxfold/__pycache__/cli.cpython-311.pyc",
        "server/ctxfold.egg-info/PKG-INFO",
    ],
)
def test_dockerignore_keeps_clients_tool_caches_and_venvs_out(path: str) -> None:
    assert dockerignored(path)


def test_dockerignore_lets_in_every_server_file() -> None:
    tracked = subprocess.run(["git", "ls-files", "server"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = tracked.stdout.split()
    assert len(files) > 50
    assert [f for f in files if dockerignored(f)] == []


# ---- constraints.txt --------------------------------------------------------------------------------


def _pins() -> dict[str, str]:
    pins = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version
    return pins


def test_constraints_pin_the_whole_runtime_closure_and_satisfy_it() -> None:
    """Offline: walk ctxfold's requirements (with the extras it asks for) through the installed
    distributions' metadata, as pip would on the image's Linux / CPython 3.11, and check that every
    package reached is pinned and that each pin satisfies every requirement on it."""
    pins = _pins()
    environment = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                   "python_version": "3.11", "python_full_version": "3.11.0", "implementation_name": "cpython",
                   "platform_python_implementation": "CPython"}  # fmt: skip
    pending = [(Requirement(r), "ctxfold") for r in metadata.requires("ctxfold") or []]
    seen: set[str] = set()
    problems = []
    while pending:
        requirement, wanted_by = pending.pop()
        extras = set(requirement.extras)
        if requirement.marker is not None and not any(
            requirement.marker.evaluate({**environment, "extra": extra}) for extra in (extras or {""})
        ):
            continue
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{name} (needed by {wanted_by}) is not pinned")
            continue
        if not requirement.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{name}=={pins[name]} does not satisfy {requirement} (from {wanted_by})")
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        for raw in metadata.requires(requirement.name) or []:
            dependency = Requirement(raw)
            marker = dependency.marker
            if marker is None or any(marker.evaluate({**environment, "extra": e}) for e in extras | {""}):
                dependency.marker = None
                pending.append((dependency, name))
    assert problems == []
    reached = {key.split("[")[0] for key in seen}
    assert set(pins) == reached, f"pinned but not needed: {set(pins) - reached}; needed: {reached - set(pins)}"


# ---- the health check follows the server's settings ---------------------------------------------------


@pytest.mark.parametrize("source", ["flag", "config", "relative config", "relative config in env", "environment"])
def test_healthcheck_follows_the_servers_flags_config_and_environment(tmp_path: Path, source: str) -> None:
    port = free_port()
    listen = f"127.0.0.1:{port}"
    args, env = ["--data-dir", str(tmp_path / "data")], {}
    if source == "flag":
        args += ["--listen", listen]
    elif source.endswith("config"):
        (tmp_path / "ctxfold.toml").write_text(f'listen = "{listen}"\n')
        args += ["--config", "ctxfold.toml" if source == "relative config" else str(tmp_path / "ctxfold.toml")]
    elif source == "relative config in env":
        (tmp_path / "ctxfold.toml").write_text(f'listen = "{listen}"\n')
        env["CTXFOLD_CONFIG"] = "ctxfold.toml"
    else:
        env["CTXFOLD_LISTEN"] = listen
    with serving(tmp_path, args, env, port) as served:
        elsewhere = tmp_path / "elsewhere"  # the check runs in another folder than the server
        elsewhere.mkdir()
        done = subprocess.run(
            [*ctxfold_command(), "healthcheck", "--pid", str(served.process.pid)],
            cwd=elsewhere,
            env=clean_environ(tmp_path, {}),  # the check's own environment names no port
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{listen}: SERVING"
        served.process.terminate()
        served.process.wait(timeout=15)
    gone = subprocess.run(
        [*ctxfold_command(), "healthcheck", "--pid", str(served.process.pid)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert gone.returncode == 1 and gone.stderr.startswith("ctxfold healthcheck: cannot read process")


def test_healthcheck_targets_this_machine_for_a_wildcard_listen() -> None:
    assert check_target("0.0.0.0:50051") == "127.0.0.1:50051"
    assert check_target("[::]:50051") == "127.0.0.1:50051"
    assert check_target("10.1.2.3:7000") == "10.1.2.3:7000"
    assert check_target("[::1]:7000") == "[::1]:7000"


def test_healthcheck_reads_a_serve_that_also_runs_the_gateway() -> None:
    """The embedded gateway's flags are the serve command's too; the check ignores them, not fails on them."""
    parser = argparse.ArgumentParser()
    serve = cli._serve_parser(parser.add_subparsers())
    argv = ["ctxfold", "serve", "--listen", "127.0.0.1:7001", "--gateway-listen", "127.0.0.1:7002"]
    argv += ["--fail-mode", "closed"]
    assert served_settings(argv, {}, serve).listen == "127.0.0.1:7001"


# ---- drain and compose -----------------------------------------------------------------------------------


def _compose_services() -> dict[str, str]:
    """Each service's block of compose.yaml (the file is simple enough not to need a YAML parser)."""
    text = (ROOT / "compose.yaml").read_text()
    body = text.split("\nservices:\n", 1)[1].split("\nvolumes:", 1)[0]
    blocks = re.split(r"^  (\w[\w-]*):\n", body, flags=re.M)
    return dict(zip(blocks[1::2], blocks[2::2], strict=True))


def test_drains_fit_inside_the_stop_timeouts() -> None:
    env = " ".join(args for keyword, args in _instructions() if keyword == "ENV")
    image_grace = float(re.search(r"CTXFOLD_GRACE_SECONDS=(\d+(?:\.\d+)?)", env).group(1))  # type: ignore[union-attr]
    assert image_grace < 10  # `docker stop` waits 10 s before SIGKILL
    ctxfold = _compose_services()["ctxfold"]
    compose_grace = float(re.search(r'CTXFOLD_GRACE_SECONDS: "(\d+)"', ctxfold).group(1))  # type: ignore[union-attr]
    stop_period = float(re.search(r"stop_grace_period: (\d+)s", ctxfold).group(1))  # type: ignore[union-attr]
    assert stop_period > compose_grace


def test_compose_publishes_on_loopback_restarts_and_sends_no_metrics_to_jaeger() -> None:
    services = _compose_services()
    assert set(services) == {"jaeger", "ctxfold"}
    for name, block in services.items():
        published = re.findall(r'^\s+- "([^"]+)"', block.split("ports:", 1)[1], flags=re.M)
        assert published and all(p.startswith("127.0.0.1:") for p in published), (name, published)
        assert "restart: unless-stopped" in block, name
    assert "OTEL_METRICS_EXPORTER: none" in services["ctxfold"]


def test_the_server_version_is_the_project_version() -> None:
    """One version for the server and every SDK: the root VERSION file (the SDKs' own tests check theirs)."""
    assert metadata.version("ctxfold") == (ROOT / "VERSION").read_text().strip()


def test_make_serve_the_tests_and_the_image_install_the_same_pins() -> None:
    """One set of pins: every pip install of the Makefile and the Dockerfile takes constraints.txt."""
    installs = [
        line
        for path in ("Makefile", "Dockerfile")
        for line in (ROOT / path).read_text().splitlines()
        if "pip install" in line and "-U pip" not in line and "--upgrade pip" not in line
    ]
    assert len(installs) >= 3, installs
    unpinned = [line.strip() for line in installs if "--constraint constraints.txt" not in line]
    assert unpinned == []
