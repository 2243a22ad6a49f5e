"""Opaque page tokens: base64url JSON bound to what they page, so a token from one listing cannot be
replayed against another."""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

from ctxfold.engine.errors import invalid

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def page_size(requested: int, default: int = DEFAULT_PAGE_SIZE, maximum: int = MAX_PAGE_SIZE) -> int:
    """The page size a listing uses: `default` for 0 (AIP-158). Outside [0, maximum] it is refused, not
    clamped, so a client never mistakes a short page for the whole listing."""
    if not 0 <= requested <= maximum:
        raise invalid(
            "INVALID_PAGE_SIZE",
            f"page_size must be within [0, {maximum}] (0 = {default}), got {requested}",
            max_page_size=maximum,
        )
    return requested or default


def encode_token(scope: str, position: list[Any]) -> str:
    raw = json.dumps({"s": scope, "p": position}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(scope: str, token: str, shape: tuple[type, ...]) -> tuple[Any, ...] | None:
    """The position a token of this `scope` holds, checked against `shape` (one type per element, an integer
    given for a float made one), or None for no token. Anything else, including a forged position, is
    INVALID_PAGE_TOKEN."""
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        position = data["p"]
        if data["s"] != scope or not isinstance(position, list) or len(position) != len(shape):
            raise ValueError("scope")
        if not all(_has_type(value, kind) for value, kind in zip(position, shape, strict=True)):
            raise ValueError("shape")
        return tuple(float(value) if kind is float else value for value, kind in zip(position, shape, strict=True))
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError, binascii.Error):
        raise invalid("INVALID_PAGE_TOKEN", "page_token is not a token this listing returned") from None


def _has_type(value: object, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, int | float) and math.isfinite(value)
    if kind is int:  # what a database integer column holds
        return isinstance(value, int) and -(2**63) <= value < 2**63
    if kind is str:  # ids; PostgreSQL cannot compare text holding NUL
        return isinstance(value, str) and "\x00" not in value
    return isinstance(value, kind)
