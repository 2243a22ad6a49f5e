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


def setting(default: Any, text: str, minimum: float | None = None) -> Any:
    """A settings dataclass field: its default, its help `text` and the least value it takes."""
    return field(default=default, metadata={"help": text} if minimum is None else {"help": text, "minimum": minimum})


@dataclass(frozen=True)
class Settings:
    listen: str = setting("127.0.0.1:50051", "address to listen on (host:port)")
    data_dir: str = field(default_factory=default_data_dir, metadata={"help": "where the default SQLite file lives"})
    database: str = setting("", "SQLAlchemy URL (sqlite:///PATH or postgresql://…); default DATA_DIR/ctxfold.db")
    db_pool_size: int = setting(10, "database connections per server process", minimum=1)
    auth_tokens_file: str = setting("", "file of 'TOKEN TENANT' lines; empty = no auth")
    tls_cert: str = setting("", "PEM server certificate (enables TLS)")
    tls_key: str = setting("", "PEM server private key")
    tls_client_ca: str = setting("", "PEM CA bundle; when set, clients must present a cert")
    # gRPC copies requests and answers whole on the loop: these keep health checks fast (docs/operations.md, Limits).
    max_receive_message_bytes: int = setting(20 << 20, "largest gRPC request accepted", minimum=64 << 10)
    max_send_message_bytes: int = setting(24 << 20, "largest gRPC response sent", minimum=64 << 10)
    max_message_bytes: int = setting(4 << 20, "largest non-tool message (content+reasoning)", minimum=1)
    max_tool_result_bytes: int = setting(16 << 20, "largest raw tool result", minimum=1)
    # Else large requests fault fresh pages in on the loop (`ctxfold.memory`); why 256 MiB: docs/operations.md, Limits.
    retained_heap_bytes: int = setting(
        256 << 20, "freed memory kept for the next large requests, not returned to the OS (glibc; 0 = off)", minimum=0
    )
    max_concurrent_rpcs: int = setting(
        256, "ContextService RPCs served at once (health not counted); more are refused", minimum=1
    )
    max_concurrent_rpcs_per_tenant: int = setting(
        64, "RPCs one tenant may have in progress at once; more are refused", minimum=1
    )
    # Eight of the largest requests: about `retained_heap_bytes` in use at the peak (docs/operations.md, Limits).
    max_concurrent_request_bytes: int = setting(
        160 << 20, "bytes of large requests (1 MiB or more) in progress at once; more are refused", minimum=0
    )
    max_waiting_per_session: int = setting(
        16, "Prepare/Compact calls that may wait for one session's maintenance", minimum=0
    )
    hot_state_max_bytes: int = setting(
        256 << 20,
        "estimated bytes of active sessions' views kept in memory (0 = none): the Prepare hot path",
        minimum=0,
    )
    gateway_listen: str = setting(
        "", "also run the provider-compatible HTTP gateway on this address (host:port); see docs/gateway.md"
    )
    grace_seconds: float = setting(30.0, "time in-flight RPCs get to finish on shutdown", minimum=0)
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR")
    summarizers: str = setting(
        "",
        "summarizers by name, as JSON (or [summarizers.NAME] tables in the TOML file), e.g. "
        '{"gpt": {"type": "openai", "base_url": "…", "model": "…", "api_key_env": "OPENAI_API_KEY"}}; '
        "'extractive' is always there",
    )

    def database_url(self) -> str:
        return self.database or f"sqlite:///{Path(self.data_dir) / 'ctxfold.db'}"


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _coerce(name: str, value: Any, fields: Mapping[str, dataclasses.Field[Any]] = FIELDS) -> Any:
    """`value` as the setting's type, at least its metadata's `minimum` (a count never negative, a pool never empty)."""
    kind, minimum = fields[name].type, fields[name].metadata.get("minimum")
    try:
        if kind not in ("int", "float"):
            return json.dumps(value) if isinstance(value, dict) else str(value)  # a dict: a TOML table
        number = int(value) if kind == "int" else float(value)
    except (TypeError, ValueError):
        raise ValueError(f"setting {name}: {value!r} is not a valid {kind}") from None
    if minimum is not None and not number >= minimum:
        raise ValueError(f"setting {name}: {value!r} is below its minimum, {minimum}")
    return number


def load_values(
    kind: type[Any], flags: Mapping[str, Any], environ: Mapping[str, str], config_path: str, prefix: str
) -> dict[str, Any]:
    """`kind`'s settings from flags (None: not given), `prefix`ed variables and the TOML file, in that precedence."""
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
        for value in (environ.get(f"{prefix}{name.upper()}"), flags.get(name)):
            if value is not None:
                values[name] = _coerce(name, value, fields)
    return values


# The client commands' bearer token when --token is not given: a flag shows in `ps`, the environment does not.
TOKEN_ENV = "CTXFOLD_TOKEN"


def load_settings(flags: Mapping[str, Any], environ: Mapping[str, str], config_path: str = "") -> Settings:
    """`flags`: the command line's options, None where not given (other names are not settings: ignored)."""
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
    # Imported here: the other commands' settings need no SQLAlchemy.
    from sqlalchemy.exc import ArgumentError

    from ctxfold.store.database import async_url

    try:
        async_url(settings.database_url())
    except (ValueError, ArgumentError) as exc:
        raise ValueError(f"setting database: {exc}") from None
    return settings


def check_address(name: str, address: str) -> None:
    """HOST:PORT with a port number: gRPC would take a bare host as port 443 (https's)."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"setting {name}: {address!r} is not HOST:PORT (e.g. 127.0.0.1:50051)")
