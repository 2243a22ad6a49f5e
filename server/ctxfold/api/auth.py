"""Bearer-token authentication. Tokens map to tenants; every query is scoped by the caller's tenant.
Without a tokens file the server is single-tenant (tenant "default") and asks for no token."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc

from ctxfold.engine.errors import DomainError, Kind

SINGLE_TENANT = "default"


def unauthenticated(message: str) -> DomainError:
    return DomainError(Kind.UNAUTHENTICATED, "UNAUTHENTICATED", message)


def load_tokens(path: Path) -> dict[str, str]:
    """Reads `TOKEN TENANT` lines (blank lines and `#` comments ignored); keys are SHA-256 digests."""
    tokens: dict[str, str] = {}
    for number, raw_line in enumerate(path.read_text().splitlines(), 1):
        parts = raw_line.split("#", 1)[0].split()
        if not parts:
            continue
        if len(parts) != 2:
            raise ValueError(f"{path}:{number}: expected 'TOKEN TENANT'")
        token, tenant = parts
        if len(token) < 16:
            raise ValueError(f"{path}:{number}: tokens must be at least 16 characters")
        tokens[hashlib.sha256(token.encode()).hexdigest()] = tenant
    if not tokens:
        raise ValueError(f"{path}: no tokens")
    return tokens


def tenant_of(tokens: dict[str, str] | None, context: grpc.aio.ServicerContext[object, object]) -> str:
    if tokens is None:
        return SINGLE_TENANT
    header = next((value for key, value in context.invocation_metadata() or () if key == "authorization"), "")
    scheme, _, token = (header if isinstance(header, str) else header.decode()).partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise unauthenticated("missing bearer token: send metadata 'authorization: Bearer <token>'")
    # Looking up the token's digest leaks nothing usable about other tokens through timing.
    tenant = tokens.get(hashlib.sha256(token.strip().encode()).hexdigest())
    if tenant is None:
        raise unauthenticated("invalid bearer token")
    return tenant
