"""Opaque page tokens: base64url JSON bound to what they page, so a token from one listing cannot be
replayed against another."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from ctxfold.engine.errors import invalid

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def page_size(requested: int) -> int:
    if requested < 0:
        raise invalid("INVALID_PAGE_SIZE", f"page_size must be >= 0 (0 = {DEFAULT_PAGE_SIZE}), got {requested}")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def encode_token(scope: str, position: list[Any]) -> str:
    raw = json.dumps({"s": scope, "p": position}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(scope: str, token: str) -> list[Any] | None:
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        if data["s"] != scope or not isinstance(data["p"], list):
            raise ValueError("scope")
        return list(data["p"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise invalid("INVALID_PAGE_TOKEN", "page_token is not a token this listing returned") from None
