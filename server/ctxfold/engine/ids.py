"""What ctxfold's ids look like. They are random: the shell makes them and hands them to the engine's steps,
which stay deterministic; their form is the engine's because a result ref is read in summaries."""

from __future__ import annotations

import os


def new_id(prefix: str) -> str:
    """`prefix`, an underscore and 128 random bits in hex (a UUID's digits without its version bits)."""
    return f"{prefix}_{os.urandom(16).hex()}"


# Each byte value to a base32 digit (a-z, 2-7): 256 is a multiple of 32, so every digit is as likely.
_BASE32_DIGIT = bytes.maketrans(bytes(range(256)), b"abcdefghijklmnopqrstuvwxyz234567" * 8)


def new_result_ref() -> str:
    """80 random bits in 16 base32 digits: about 11 tokens in a summary against 20 for a hex UUID.
    Translated in C (base64's b32encode is Python): one is made for every user message and tool result."""
    return "tr_" + os.urandom(16).translate(_BASE32_DIGIT).decode()
