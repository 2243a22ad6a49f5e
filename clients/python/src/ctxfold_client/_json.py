"""The one form of the JSON this SDK writes itself (tool schemas, tool call arguments given as
objects, Anthropic tool inputs, the context_budget answer): JavaScript's `JSON.stringify`, so the
four SDKs write the same bytes (clients/README.md, "JSON the SDKs write"). Python's `json.dumps`
differs in its numbers (`1.0`, `1e-07`) and leaves lone surrogates unescaped."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(value: Any) -> str:
    """`value` (dicts, lists, str, int, float, bool, None) as compact JSON, keys in their order."""
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def normalized(text: str) -> str:
    """JSON text in the one form (raises ValueError when it is not JSON)."""
    return dumps(json.loads(text))


def _write(value: Any, out: list[str]) -> None:
    if value is None or value is True or value is False:
        out.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(number(value))
    elif isinstance(value, Mapping):
        out.append("{")
        for index, (key, item) in enumerate(value.items()):
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys are strings, not {type(key).__name__}")
            out.append("," if index else "")
            out.append(_string(key) + ":")
            _write(item, out)
        out.append("}")
    elif isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        out.append("[")
        for index, item in enumerate(value):
            out.append("," if index else "")
            _write(item, out)
        out.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON")


def _string(text: str) -> str:
    written = json.dumps(text, ensure_ascii=False)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", written)


def number(value: float) -> str:
    """A float as JavaScript writes it (ECMAScript Number::toString), from its shortest digits."""
    if not math.isfinite(value):
        return "null"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    exact = Decimal(repr(abs(value))).as_tuple()
    raw = "".join(map(str, exact.digits))
    digits = raw.rstrip("0")
    exponent = int(exact.exponent) + len(raw) - len(digits)
    k = len(digits)
    n = exponent + k  # value = 0.digits * 10**n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        power = n - 1
        mantissa = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
        text = f"{mantissa}e{'+' if power > 0 else '-'}{abs(power)}"
    return sign + text
