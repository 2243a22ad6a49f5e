"""Server settings. Each option comes, in this order of precedence, from a command-line flag, an
environment variable CTXFOLD_<NAME>, a TOML file (--config / CTXFOLD_CONFIG), or its default."""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "ctxfold")


@dataclass(frozen=True)
class Settings:
    listen: str = field(default="127.0.0.1:50051", metadata={"help": "address to listen on (host:port)"})
    data_dir: str = field(default_factory=default_data_dir, metadata={"help": "where the default SQLite file lives"})
    database: str = field(
        default="",
        metadata={"help": "SQLAlchemy URL (sqlite:///PATH or postgresql://…); default DATA_DIR/ctxfold.db"},
    )
    db_pool_size: int = field(default=10, metadata={"minimum": 1, "help": "database connections per server process"})
    auth_tokens_file: str = field(default="", metadata={"help": "file of 'TOKEN TENANT' lines; empty = no auth"})
    tls_cert: str = field(default="", metadata={"help": "PEM server certificate (enables TLS)"})
    tls_key: str = field(default="", metadata={"help": "PEM server private key"})
    tls_client_ca: str = field(default="", metadata={"help": "PEM CA bundle; when set, clients must present a cert"})
    # gRPC copies each request and answer whole on the event loop (about 2 ms per MiB): these keep health
    # checks well under 100 ms (docs/operations.md, Limits). An AppendMessages answer echoes its request.
    max_receive_message_bytes: int = field(
        default=20 << 20, metadata={"minimum": 64 << 10, "help": "largest gRPC request accepted"}
    )
    max_send_message_bytes: int = field(
        default=24 << 20, metadata={"minimum": 64 << 10, "help": "largest gRPC response sent"}
    )
    max_message_bytes: int = field(
        default=4 << 20, metadata={"minimum": 1, "help": "largest non-tool message (content+reasoning)"}
    )
    max_tool_result_bytes: int = field(default=16 << 20, metadata={"minimum": 1, "help": "largest raw tool result"})
    # Without it every copy of the next large request faults fresh pages in on the event loop (`ctxfold.memory`);
    # why 256 MiB: docs/operations.md, Limits.
    retained_heap_bytes: int = field(
        default=256 << 20,
        metadata={
            "minimum": 0,
            "help": "freed memory kept for the next large requests, not returned to the OS (glibc; 0 = off)",
        },
    )
    max_concurrent_rpcs: int = field(
        default=256,
        metadata={"minimum": 1, "help": "ContextService RPCs served at once (health not counted); more are refused"},
    )
    max_concurrent_rpcs_per_tenant: int = field(
        default=64, metadata={"minimum": 1, "help": "RPCs one tenant may have in progress at once; more are refused"}
    )
    # Eight of the largest requests, one worked on at a time, kept 275-315 MiB of heap in use at the peak:
    # about `retained_heap_bytes` plus the server's own (`bench/availability.py`).
    max_concurrent_request_bytes: int = field(
        default=160 << 20,
        metadata={
            "minimum": 0,
            "help": "bytes of large requests (1 MiB or more) in progress at once; more are refused",
        },
    )
    max_waiting_per_session: int = field(
        default=16, metadata={"minimum": 0, "help": "Prepare/Compact calls that may wait for one session's maintenance"}
    )
    hot_state_max_bytes: int = field(
        default=256 << 20,
        metadata={
            "minimum": 0,
            "help": "estimated bytes of active sessions' views kept in memory (0 = none): the Prepare hot path",
        },
    )
    gateway_listen: str = field(
        default="",
        metadata={
            "help": "also run the provider-compatible HTTP gateway on this address (host:port); see docs/gateway.md"
        },
    )
    grace_seconds: float = field(
        default=30.0, metadata={"minimum": 0, "help": "time in-flight RPCs get to finish on shutdown"}
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING or ERROR"})
    summarizers: str = field(
        default="",
        metadata={
            "help": "summarizers by name, as JSON (or [summarizers.NAME] tables in the TOML file), e.g. "
            '{"gpt": {"type": "openai", "base_url": "…", "model": "…", "api_key_env": "OPENAI_API_KEY"}}; '
            "'extractive' is always there"
        },
    )

    def database_url(self) -> str:
        return self.database or f"sqlite:///{Path(self.data_dir) / 'ctxfold.db'}"


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _coerce(name: str, value: Any, fields: Mapping[str, dataclasses.Field[Any]] = FIELDS) -> Any:
    """`value` as the setting's type, at least the `minimum` of its metadata (a number of things is never
    negative, a pool never empty)."""
    kind, minimum = fields[name].type, fields[name].metadata.get("minimum")
    try:
        if kind == "int":
            number: int | float = int(value)
        elif kind == "float":
            number = float(value)
        else:
            return json.dumps(value) if isinstance(value, dict) else str(value)  # a dict: a TOML table
    except (TypeError, ValueError):
        raise ValueError(f"setting {name}: {value!r} is not a valid {kind}") from None
    if minimum is not None and not number >= minimum:
        raise ValueError(f"setting {name}: {value!r} is below its minimum, {minimum}")
    return number


def load_values(
    kind: type[Any], flags: Mapping[str, Any], environ: Mapping[str, str], config_path: str, prefix: str
) -> dict[str, Any]:
    """The values of the settings dataclass `kind` given by flags, `prefix`-named environment variables
    and the TOML file, in that order of precedence (`flags` holds only the options given)."""
    fields = {f.name: f for f in dataclasses.fields(kind)}
    values: dict[str, Any] = {}
    path = config_path or environ.get(f"{prefix}CONFIG", "")
    if path:
        with open(path, "rb") as f:
            try:
                document = tomllib.load(f)
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: invalid TOML: {exc}") from None
        for key, value in document.items():
            name = key.replace("-", "_")
            if name not in fields:
                raise ValueError(f"{path}: unknown setting {key!r}")
            values[name] = _coerce(name, value, fields)
    for name in fields:
        env = environ.get(f"{prefix}{name.upper()}")
        if env is not None:
            values[name] = _coerce(name, env, fields)
    for name, value in flags.items():
        if value is not None:
            values[name] = _coerce(name, value, fields)
    return values


# The bearer token of the client commands (sessions, show, replay) when --token is not given: a flag
# shows in `ps`, the environment does not.
TOKEN_ENV = "CTXFOLD_TOKEN"


def load_settings(flags: Mapping[str, Any], environ: Mapping[str, str], config_path: str = "") -> Settings:
    """`flags` holds only the options given on the command line."""
    settings = Settings(**load_values(Settings, flags, environ, config_path, "CTXFOLD_"))
    if settings.log_level.upper() not in LOG_LEVELS:
        raise ValueError(f"setting log_level: {settings.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ValueError("tls_cert and tls_key must be given together")
    if settings.tls_client_ca and not settings.tls_cert:
        raise ValueError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
    check_address("listen", settings.listen)
    if settings.gateway_listen:
        check_address("gateway_listen", settings.gateway_listen)
    _check_database(settings.database_url())
    return settings


def check_address(name: str, address: str) -> None:
    """HOST:PORT with a port number: gRPC would take a bare host as port 443 (https's)."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"setting {name}: {address!r} is not HOST:PORT (e.g. 127.0.0.1:50051)")


def _check_database(url: str) -> None:
    # Imported here: the other commands' settings need no SQLAlchemy.
    from sqlalchemy.exc import ArgumentError

    from ctxfold.store.database import async_url

    try:
        async_url(url)
    except (ValueError, ArgumentError) as exc:
        raise ValueError(f"setting database: {exc}") from None
