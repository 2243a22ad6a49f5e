"""`ctxfold serve` as an operator runs it: a real process on a loopback port, configured by flags,
CTXFOLD_* environment variables and a TOML file, spoken to by clients that know only what server
reflection tells them."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message as ProtoMessage
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from conftest import free_port
from ctxfold import __version__
from ctxfold.config import Settings, load_settings

SERVICE = "ctxfold.v1.ContextService"
HEALTH_SERVICE = "grpc.health.v1.Health"
START_TIMEOUT = 20.0
RPC_TIMEOUT = 10.0


def ctxfold_command() -> list[str]:
    script = Path(sys.executable).parent / "ctxfold"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ctxfold.cli"]


def clean_environ(tmp: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """The test's environment without any CTXFOLD_* setting that could leak in, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXFOLD_")}
    env["XDG_DATA_HOME"] = str(tmp / "xdg")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def toml_file(path: Path, values: Mapping[str, object]) -> Path:
    lines = [f"{key} = {json.dumps(value)}" for key, value in values.items()]  # JSON scalars are TOML too
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    port: int
    stderr_path: Path

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def health_status(target: str, service: str, timeout: float = 1.0) -> int:
    with grpc.insecure_channel(target) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
        return int(response.status)


def wait_serving(served: Served) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        code = served.process.poll()
        if code is not None:
            pytest.fail(f"ctxfold serve exited with {code} before serving:\n{served.stderr()}")
        try:
            if health_status(served.target, "") == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"ctxfold serve did not report SERVING within {START_TIMEOUT}s:\n{served.stderr()}")
        time.sleep(0.1)


def stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


@contextlib.contextmanager
def serving(tmp: Path, args: list[str], env: Mapping[str, str], port: int) -> Iterator[Served]:
    stderr_path = tmp / f"stderr-{port}.log"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [*ctxfold_command(), "serve", *args],
            cwd=tmp,
            env=clean_environ(tmp, env),
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
        )
    served = Served(process, port, stderr_path)
    try:
        wait_serving(served)
        yield served
    finally:
        stop(process)


# --- settings precedence, as a unit --------------------------------------------------------------------


def test_load_settings_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    config = toml_file(
        tmp_path / "ctxfold.toml",
        {
            "listen": "127.0.0.1:1001",
            "data_dir": "/from/file",
            "grace_seconds": 7.5,
            "log_level": "DEBUG",
            "db-pool-size": 3,  # hyphenated keys are accepted too
        },
    )
    environ = {"CTXFOLD_LISTEN": "127.0.0.1:1002", "CTXFOLD_DATA_DIR": "/from/env", "UNRELATED": "x"}
    flags: dict[str, Any] = {"listen": "127.0.0.1:1003", "data_dir": None, "grace_seconds": None}

    settings = load_settings(flags, environ, str(config))

    assert settings.listen == "127.0.0.1:1003"  # flag > env > file
    assert settings.data_dir == "/from/env"  # env > file (the flag was not given)
    assert settings.grace_seconds == 7.5  # file > default
    assert settings.log_level == "DEBUG"
    assert settings.db_pool_size == 3
    assert settings.max_concurrent_rpcs == Settings().max_concurrent_rpcs  # default
    assert settings.database_url() == "sqlite:////from/env/ctxfold.db"


def test_load_settings_types_and_config_from_env(tmp_path: Path) -> None:
    config = toml_file(tmp_path / "c.toml", {"max_concurrent_rpcs": 12, "database": "sqlite:///x.db"})
    environ = {"CTXFOLD_CONFIG": str(config), "CTXFOLD_GRACE_SECONDS": "2.5", "CTXFOLD_DB_POOL_SIZE": "4"}
    settings = load_settings({}, environ)
    assert settings.max_concurrent_rpcs == 12
    assert settings.grace_seconds == 2.5
    assert settings.db_pool_size == 4
    assert settings.database_url() == "sqlite:///x.db"
    # An explicit --config wins over CTXFOLD_CONFIG.
    other = toml_file(tmp_path / "other.toml", {"max_concurrent_rpcs": 13})
    assert load_settings({}, environ, str(other)).max_concurrent_rpcs == 13
    # Without any source, the defaults; the database lives in the data dir.
    defaults = load_settings({}, {})
    assert defaults == Settings()
    assert defaults.database_url() == f"sqlite:///{Path(defaults.data_dir) / 'ctxfold.db'}"


@pytest.mark.parametrize(
    ("file", "environ", "flags", "message"),
    [
        ({"bogus": 1}, {}, {}, "unknown setting 'bogus'"),
        ({"tls_cert": "/c.pem"}, {}, {}, "tls_cert and tls_key must be given together"),
        ({}, {"CTXFOLD_TLS_KEY": "/k.pem"}, {}, "tls_cert and tls_key must be given together"),
        ({}, {}, {"tls_client_ca": "/ca.pem"}, "tls_client_ca"),
        ({"grace_seconds": "soon"}, {}, {}, "grace_seconds"),
        ({}, {"CTXFOLD_DB_POOL_SIZE": "many"}, {}, "db_pool_size"),
        ({}, {"CTXFOLD_DB_POOL_SIZE": "0"}, {}, "setting db_pool_size: '0' is below its minimum, 1"),
        ({"max_concurrent_rpcs": -1}, {}, {}, "setting max_concurrent_rpcs: -1 is below its minimum, 1"),
        ({}, {}, {"max_send_message_bytes": "10"}, "max_send_message_bytes: '10' is below its minimum, 65536"),
        ({}, {}, {"grace_seconds": "-1"}, "grace_seconds: '-1' is below its minimum, 0"),
        ({}, {"CTXFOLD_GRACE_SECONDS": "nan"}, {}, "grace_seconds: 'nan' is below its minimum, 0"),
    ],
)
def test_load_settings_rejects_bad_configuration(
    tmp_path: Path, file: dict[str, object], environ: dict[str, str], flags: dict[str, Any], message: str
) -> None:
    config = toml_file(tmp_path / "bad.toml", file)
    with pytest.raises(ValueError, match=message):
        load_settings(flags, environ, str(config))


# --- the real process ------------------------------------------------------------------------------------


@dataclass
class Cli:
    served: Served
    tmp: Path


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """One server for the read-mostly tests: the port comes from a flag that beats the environment,
    which beats the file; the data dir from the environment, which beats the file; the message
    limit only from the file."""
    tmp = tmp_path_factory.mktemp("cli")
    port = free_port()
    config = toml_file(
        tmp / "ctxfold.toml",
        {
            "listen": f"127.0.0.1:{free_port()}",
            "data_dir": str(tmp / "data-from-file"),
            "max_receive_message_bytes": 1 << 20,
            "grace_seconds": 2.0,
        },
    )
    env = {"CTXFOLD_LISTEN": f"127.0.0.1:{free_port()}", "CTXFOLD_DATA_DIR": str(tmp / "data")}
    with serving(tmp, ["--config", str(config), "--listen", f"127.0.0.1:{port}"], env, port) as served:
        yield Cli(served, tmp)


def test_serves_health_and_stores_in_the_data_dir(cli: Cli) -> None:
    for service in ("", SERVICE):
        assert health_status(cli.served.target, service, RPC_TIMEOUT) == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as unknown:
        health_status(cli.served.target, "no.such.Service", RPC_TIMEOUT)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    assert (cli.tmp / "data" / "ctxfold.db").is_file()
    assert not (cli.tmp / "data-from-file").exists()
    stderr = cli.served.stderr()
    assert f"serving on 127.0.0.1:{cli.served.port}" in stderr
    assert "without authentication" not in stderr  # loopback only: no warning


def test_reflection_lists_the_services(cli: Cli) -> None:
    with grpc.insecure_channel(cli.served.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = list(
            stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
        )
    assert len(responses) == 1
    names = {s.name for s in responses[0].list_services_response.service}
    assert {SERVICE, HEALTH_SERVICE, "grpc.reflection.v1alpha.ServerReflection"} <= names


class ReflectedClient:
    """A client that knows nothing but the server's address: types and method paths come from reflection."""

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        self.service = self.pool.FindServiceByName(SERVICE)
        assert self.pool is not descriptor_pool.Default()

    def enum(self, enum_name: str, value_name: str) -> int:
        return int(self.pool.FindEnumTypeByName(enum_name).values_by_name[value_name].number)

    def request(self, method: str, **fields: Any) -> ProtoMessage:
        descriptor = self.service.methods_by_name[method].input_type
        return message_factory.GetMessageClass(descriptor)(**fields)

    def call(self, method: str, request: ProtoMessage) -> Any:
        descriptor = self.service.methods_by_name[method]
        assert not descriptor.server_streaming and not descriptor.client_streaming
        assert request.DESCRIPTOR is descriptor.input_type
        response_class = message_factory.GetMessageClass(descriptor.output_type)
        rpc = self.channel.unary_unary(
            f"/{self.service.full_name}/{descriptor.name}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_class.FromString,
        )
        return rpc(request, timeout=RPC_TIMEOUT)


def big_tool_output(size: int) -> str:
    """Exactly `size` UTF-8 bytes with 2-, 3- and 4-byte characters all over, so pages split inside lines."""
    parts: list[str] = []
    total, line = 0, 0
    while True:
        piece = f"{line:06d} αβγ ✓ 😀 path/to/file_{line}.py: ok\n"
        if total + len(piece.encode()) > size:
            break
        parts.append(piece)
        total += len(piece.encode())
        line += 1
    parts.append("x" * (size - total))
    text = "".join(parts)
    assert len(text.encode()) == size
    return text


def test_a_client_made_only_from_reflection(cli: Cli) -> None:
    raw = big_tool_output(200 * 1024)
    with grpc.insecure_channel(cli.served.target) as channel:
        client = ReflectedClient(channel)
        role = {name: client.enum("ctxfold.v1.Role", f"ROLE_{name}") for name in ("USER", "ASSISTANT", "TOOL")}

        request = client.request("CreateSession")
        request.config.context_window = 128000  # type: ignore[attr-defined]
        session = client.call("CreateSession", request).session
        assert session.id
        assert session.config.context_window == 128000
        assert session.config.tool_content_max_bytes == 32768  # the documented default

        append = client.request("AppendMessages", session_id=session.id)
        append.messages.add(role=role["USER"], content="What is in the repository?")  # type: ignore[attr-defined]
        call = append.messages.add(role=role["ASSISTANT"], content="")  # type: ignore[attr-defined]
        call.tool_calls.add(id="call_ls", name="list_files", arguments='{"path": "."}')
        append.messages.add(role=role["TOOL"], tool_call_id="call_ls", content=raw)  # type: ignore[attr-defined]
        appended = client.call("AppendMessages", append).messages
        assert [m.seq for m in appended] == [1, 2, 3]
        assert all(m.id for m in appended)
        result = appended[2]
        assert result.truncated
        assert result.raw_bytes == len(raw.encode())
        assert result.result_ref and result.result_ref in result.content
        assert len(result.content.encode()) <= 32768

        listed: list[Any] = []
        token = ""
        while True:
            page = client.call(
                "ListMessages", client.request("ListMessages", session_id=session.id, page_size=2, page_token=token)
            )
            assert len(page.messages) <= 2
            listed.extend(page.messages)
            token = page.next_page_token
            if not token:
                break
        assert [m.id for m in listed] == [m.id for m in appended]
        assert [m.role for m in listed] == [role["USER"], role["ASSISTANT"], role["TOOL"]]
        assert listed[0].content == "What is in the repository?"
        assert [(c.id, c.name, c.arguments) for c in listed[1].tool_calls] == [
            ("call_ls", "list_files", '{"path": "."}')
        ]
        assert listed[2].tool_call_id == "call_ls"
        assert listed[2].content == result.content
        assert listed[2].result_ref == result.result_ref

        got = client.call("GetSession", client.request("GetSession", session_id=session.id)).session
        assert got.head_seq == 3

        # Page the raw result back by byte offset: first by tool_call_id, then by result_ref.
        pieces: list[str] = []
        offset, pages = 0, 0
        while True:
            name = {"tool_call_id": "call_ls"} if offset == 0 else {"result_ref": result.result_ref}
            page = client.call(
                "ReadToolResult", client.request("ReadToolResult", session_id=session.id, offset=offset, **name)
            )
            pages += 1
            assert page.offset == offset
            assert page.total_bytes == len(raw.encode())
            assert page.sha256 == hashlib.sha256(raw.encode()).hexdigest()
            size = len(page.data.encode())
            assert 0 < size <= 16384  # the default limit
            assert page.next_offset == offset + size
            pieces.append(page.data)
            offset = page.next_offset
            if page.complete:
                break
            assert pages < 100
        assert "".join(pieces) == raw
        assert offset == len(raw.encode())
        assert pages >= 200 * 1024 // 16384

        # The request limit from the TOML file applies: a 2 MiB message is refused.
        too_big = client.request("AppendMessages", session_id=session.id)
        too_big.messages.add(role=role["USER"], content="y" * (2 << 20))  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as refused:
            client.call("AppendMessages", too_big)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_graceful_shutdown_on_signal(tmp_path: Path, signum: signal.Signals) -> None:
    port = free_port()
    config = toml_file(tmp_path / "ctxfold.toml", {"grace_seconds": 9.0, "data_dir": str(tmp_path / "file")})
    env = {"CTXFOLD_GRACE_SECONDS": "3", "CTXFOLD_LISTEN": f"127.0.0.1:{port}"}
    with serving(tmp_path, ["--config", str(config)], env, port) as served:
        assert (tmp_path / "file" / "ctxfold.db").is_file()
        served.process.send_signal(signum)
        try:
            code = served.process.wait(timeout=3 + 5)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ctxfold serve did not exit within its grace period:\n{served.stderr()}")
        stderr = served.stderr()
        assert code == 0, stderr
        assert "draining for up to 3s" in stderr  # env (3) beats file (9)
        assert "stopped" in stderr
        assert "Traceback" not in stderr
        with pytest.raises(grpc.RpcError):
            health_status(served.target, "", timeout=1.0)


def test_warns_when_listening_beyond_loopback_without_auth(tmp_path: Path) -> None:
    port = free_port()
    env = {"CTXFOLD_DATA_DIR": str(tmp_path / "data")}
    with serving(tmp_path, ["--listen", f"0.0.0.0:{port}", "--grace-seconds", "1"], env, port) as served:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(timeout=10)
        warnings = [line for line in served.stderr().splitlines() if "WARNING" in line]
    assert any("authentication" in line and f"0.0.0.0:{port}" in line for line in warnings), warnings


def test_no_warning_beyond_loopback_with_auth(tmp_path: Path) -> None:
    port = free_port()
    tokens = tmp_path / "tokens"
    tokens.write_text("0123456789abcdef0123 tenant-a\n")
    env = {"CTXFOLD_DATA_DIR": str(tmp_path / "data"), "CTXFOLD_AUTH_TOKENS_FILE": str(tokens)}
    with serving(tmp_path, ["--listen", f"0.0.0.0:{port}", "--grace-seconds", "1"], env, port) as served:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(timeout=10)
        stderr = served.stderr()
    assert "without authentication" not in stderr
    assert "bearer tokens" in stderr


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("unknown-toml-key", "unknown setting 'bogus'"),
        ("invalid-toml", "ctxfold.toml: invalid TOML"),
        ("missing-config", "No such file"),
        ("cert-without-key", "tls_cert and tls_key must be given together"),
        ("client-ca-without-cert", "tls_client_ca"),
        ("bad-number", "grace_seconds"),
        ("bad-log-level", "log_level: 'verbose' is not one of DEBUG, INFO, WARNING, ERROR"),
        ("short-token", "auth_tokens_file: "),
        ("missing-tokens-file", "auth_tokens_file: cannot read"),
        ("missing-cert-file", "tls_cert: cannot read"),
        ("listen-without-port", "setting listen: '127.0.0.1' is not HOST:PORT"),
        ("gateway-listen-without-port", "setting gateway_listen: 'localhost' is not HOST:PORT"),
        ("unsupported-database", "setting database: unsupported database URL 'mysql://u@h/db'"),
        ("not-a-database-url", "setting database: "),
    ],
)
def test_bad_configuration_exits_2_with_a_clear_message(tmp_path: Path, case: str, message: str) -> None:
    config = tmp_path / "ctxfold.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    args = ["--config", str(config), "--listen", f"127.0.0.1:{free_port()}"]
    env: dict[str, str] = {}
    if case == "unknown-toml-key":
        config.write_text('bogus = "x"\n')
    elif case == "invalid-toml":
        config.write_text("listen = \n")
    elif case == "missing-config":
        args[1] = str(tmp_path / "nowhere.toml")
    elif case == "cert-without-key":
        env["CTXFOLD_TLS_CERT"] = str(tmp_path / "cert.pem")
    elif case == "client-ca-without-cert":
        args += ["--tls-client-ca", str(tmp_path / "ca.pem")]
    elif case == "bad-number":
        args += ["--grace-seconds", "soon"]
    elif case == "bad-log-level":
        args += ["--log-level", "verbose"]
    elif case == "listen-without-port":
        args[3] = "127.0.0.1"
    elif case == "gateway-listen-without-port":
        args += ["--gateway-listen", "localhost"]
    elif case == "unsupported-database":
        args += ["--database", "mysql://u@h/db"]
    elif case == "not-a-database-url":
        args += ["--database", "ctxfold.db"]
    elif case == "short-token":
        (tmp_path / "tokens").write_text("short tenant-a\n")
        args += ["--auth-tokens-file", str(tmp_path / "tokens")]
    elif case == "missing-tokens-file":
        args += ["--auth-tokens-file", str(tmp_path / "tokens")]
    elif case == "missing-cert-file":
        (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
        args += ["--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem")]
    process = subprocess.Popen(
        [*ctxfold_command(), "serve", *args],
        cwd=tmp_path,
        env=clean_environ(tmp_path, env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = process.communicate(timeout=30)
    finally:
        stop(process)
    assert process.returncode == 2, stderr
    assert "Traceback" not in stderr
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("ctxfold: "), stderr
    assert message in last_line
    if case == "short-token":
        assert "at least 16 characters" in stderr
        assert "tokens:1" in stderr  # names the file and line


def run_ctxfold(tmp: Path, args: list[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ctxfold_command(), *args],
        check=False,
        cwd=tmp,
        env=clean_environ(tmp, env or {}),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line_failure(done: subprocess.CompletedProcess[str], code: int, prefix: str) -> str:
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), done.stderr
    return lines[0]


def test_an_unreachable_database_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
    done = run_ctxfold(
        tmp_path,
        ["serve", "--listen", f"127.0.0.1:{free_port()}", "--database", f"postgresql://u:pw@127.0.0.1:{dead}/x"],
    )
    line = one_line_failure(done, 1, "ctxfold: database: cannot open ")
    assert f"127.0.0.1:{dead}" in line and "pw" not in line


def test_a_data_dir_that_cannot_be_made_is_one_line_and_exit_1(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = run_ctxfold(tmp_path, ["serve", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(blocker / "data")])
    line = one_line_failure(done, 1, "ctxfold: database: cannot create the directory of ")
    assert "a-file" in line


def test_a_port_in_use_is_one_line_without_grpc_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_ctxfold(tmp_path, ["serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path)])
    one_line_failure(done, 2, f"ctxfold: listen: cannot listen on 127.0.0.1:{port}: the port is in use")


def test_a_quiet_start_says_where_it_serves(tmp_path: Path) -> None:
    """A first start (the schema is created) logs one line until shutdown."""
    port = free_port()
    with serving(tmp_path, ["--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "new")], {}, port) as served:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(timeout=10)
        lines = served.stderr().splitlines()
    assert len(lines) == 3, lines
    assert f"INFO ctxfold: ctxfold {__version__} serving on 127.0.0.1:{port} (plaintext" in lines[0]
    assert "shutting down" in lines[1] and "stopped" in lines[2]


def test_version() -> None:
    done = run_ctxfold(Path.cwd(), ["--version"])
    assert done.returncode == 0 and done.stdout.strip() == f"ctxfold {__version__}"


def option_helps(help_text: str) -> dict[str, str]:
    """Each option of an argparse --help with its help text (joined over wrapped lines)."""
    options: dict[str, str] = {}
    current = ""
    for line in help_text.split("options:", 1)[1].splitlines():
        stripped = line.strip()
        if stripped.startswith("--") or stripped.startswith("-h"):
            current = stripped.split()[0].rstrip(",")
            options[current] = stripped
        elif current and stripped:
            options[current] += " " + stripped
    return options


@pytest.mark.parametrize("command", ["serve", "sessions", "show", "healthcheck"])
def test_every_option_shows_its_default(command: str) -> None:
    done = run_ctxfold(Path.cwd(), [command, "--help"], {"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    options = option_helps(done.stdout)
    assert len(options) >= 3
    missing = [name for name, text in options.items() if name != "-h" and "default" not in text]
    assert missing == [], done.stdout
    if command == "serve":
        assert "--listen LISTEN address to listen on (host:port) (default 127.0.0.1:50051" in " ".join(
            options["--listen"].split()
        )
