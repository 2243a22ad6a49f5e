"""Gateway settings: flags of `ctxfold gateway`, CTXFOLD_GATEWAY_<NAME> variables, a TOML file."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ctxfold.config import LOG_LEVELS, load_values, setting

ENV_PREFIX = "CTXFOLD_GATEWAY_"
FAIL_MODES = ("open", "closed")
MODES = ("ctxfold", "pass_through")


@dataclass(frozen=True)
class GatewaySettings:
    listen: str = setting("127.0.0.1:8080", "HTTP address to listen on (host:port)")
    server: str = setting("127.0.0.1:50051", "the ctxfold gRPC server (host:port)")
    token: str = setting("", "bearer token for the server, for agents the tenants file does not map")
    tls_ca: str = setting("", "PEM CA of the server's certificate (turns TLS on)")
    openai_base_url: str = setting(
        "https://api.openai.com", "upstream of /v1/chat/completions, /v1/responses and other OpenAI paths (without /v1)"
    )
    anthropic_base_url: str = setting("https://api.anthropic.com", "upstream of /v1/messages* (without /v1)")
    mode: str = setting(
        "ctxfold", "'ctxfold', or 'pass_through': forward every request unchanged (ctxfold off, same HTTP path)"
    )
    fail_mode: str = setting(
        "open", "when ctxfold cannot answer: 'open' forwards the request unchanged, 'closed' answers 503"
    )
    tenants_file: str = setting("", "file of 'SHA256_OF_API_KEY CTXFOLD_TOKEN' lines: the tenant of each agent API key")
    context_windows: str = setting("", 'windows by model name prefix, as JSON, e.g. {"my-model": 32000}')
    max_read_rounds: int = setting(4, "read_tool_result calls answered in the gateway per request", minimum=0)
    timeout_seconds: float = setting(300.0, "longest wait for ctxfold (a Prepare may fold first)", minimum=0.1)
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR")

    def windows(self) -> dict[str, int]:
        return parse_windows(self.context_windows)


FIELDS = {f.name: f for f in dataclasses.fields(GatewaySettings)}
# What `ctxfold serve --gateway-listen` takes from the gateway's options (the rest follow the server).
EMBEDDED_FIELDS = ("openai_base_url", "anthropic_base_url", "fail_mode", "tenants_file", "context_windows",
                   "max_read_rounds", "timeout_seconds")  # fmt: skip


def parse_windows(text: str) -> dict[str, int]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"setting context_windows: not JSON ({exc})") from None
    if not isinstance(value, dict) or not all(isinstance(v, int) and v > 0 for v in value.values()):
        raise ValueError("setting context_windows: must be a JSON object of model prefix -> positive window")
    return {str(k): int(v) for k, v in value.items()}


def load_gateway_settings(
    flags: Mapping[str, Any], environ: Mapping[str, str], config_path: str = "", **fixed: Any
) -> GatewaySettings:
    """`fixed` values (the embedded gateway's server address) win over everything else."""
    values = {**load_values(GatewaySettings, flags, environ, config_path, ENV_PREFIX), **fixed}
    settings = GatewaySettings(**values)
    if settings.fail_mode not in FAIL_MODES:
        raise ValueError(f"setting fail_mode: {settings.fail_mode!r} is not 'open' or 'closed'")
    if settings.mode not in MODES:
        raise ValueError(f"setting mode: {settings.mode!r} is not 'ctxfold' or 'pass_through'")
    if settings.log_level.upper() not in LOG_LEVELS:
        raise ValueError(f"setting log_level: {settings.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    for name in ("openai_base_url", "anthropic_base_url"):
        url = urlsplit(getattr(settings, name))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"setting {name}: {url.geturl()!r} is not an http(s) URL (e.g. https://api.openai.com)")
    settings.windows()
    return settings


def load_tenants(path: str) -> dict[str, str]:
    """SHA-256 (hex) of an agent's API key -> the ctxfold bearer token of its tenant."""
    if not path:
        return {}
    tenants: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or len(parts[0]) != 64:
                raise ValueError(f"{path}:{number}: expected 'SHA256_OF_API_KEY CTXFOLD_TOKEN'")
            tenants[parts[0].lower()] = parts[1]
    return tenants


def key_sha256(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()
