"""What ctxfold's ids look like. They are random (a keyed session's is derived from its key): the shell makes
them and hands them to the engine's steps, which stay deterministic; their form is the engine's because a result
ref is read in summaries."""

from __future__ import annotations

import hashlib
import os

from ctxfold.engine.errors import invalid

MAX_SESSION_KEY_CHARS = 512


def new_id(prefix: str) -> str:
    """`prefix`, an underscore and 128 random bits in hex (a UUID's digits without its version bits)."""
    return f"{prefix}_{os.urandom(16).hex()}"


def new_session_id(tenant: str, session_key: str = "") -> str:
    """A new session's id: random, or the one `session_key` names in `tenant` (the same key in two tenants names
    two sessions); a key longer than MAX_SESSION_KEY_CHARS is INVALID_REQUEST."""
    if len(session_key) > MAX_SESSION_KEY_CHARS:
        raise invalid(
            "INVALID_REQUEST", f"session_key must be at most {MAX_SESSION_KEY_CHARS} characters", field="session_key"
        )
    if not session_key:
        return new_id("s")
    return "s_" + hashlib.sha256(f"{tenant}\x00{session_key}".encode()).hexdigest()[:32]


# Each byte value to a base32 digit (a-z, 2-7): 256 is a multiple of 32, so every digit is as likely.
_BASE32_DIGIT = bytes.maketrans(bytes(range(256)), b"abcdefghijklmnopqrstuvwxyz234567" * 8)


def new_result_ref() -> str:
    """80 random bits in 16 base32 digits: about 11 tokens in a summary against 20 for a hex UUID.
    Translated in C (base64's b32encode is Python): one is made for every user message and tool result."""
    return "tr_" + os.urandom(16).translate(_BASE32_DIGIT).decode()
