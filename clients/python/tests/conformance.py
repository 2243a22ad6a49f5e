"""The engine of the language-neutral conformance scenarios (clients/conformance, format in
clients/README.md): value generation and `$name` substitution, the canonical JSON form of results,
path lookup and matchers. `test_conformance.py` binds the scenario operations to the SDK."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

from ctxfold_client import tool_definitions

CONFORMANCE_DIR = Path(__file__).resolve().parents[2] / "conformance"
SCENARIO_DIR = CONFORMANCE_DIR / "scenarios"
FIXTURE_DIR = CONFORMANCE_DIR / "fixtures"

Json = Any


def scenario_files() -> list[Path]:
    return sorted(SCENARIO_DIR.glob("*.json"))


def load(path: Path) -> dict[str, Json]:
    scenario = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(scenario, dict) and isinstance(scenario.get("steps"), list), f"{path.name}: not a scenario"
    return scenario


def fixture(name: str) -> Json:
    return json.loads((FIXTURE_DIR / name).read_text(encoding="utf-8"))


# ---- canonical JSON ------------------------------------------------------------------------------


def canonical(value: object) -> Json:
    """The canonical JSON form of a result: proto JSON with snake_case names, enums by name, 64-bit
    integers as numbers and every field present; typed results through their proto form."""
    to_proto = getattr(value, "to_proto", None)
    if callable(to_proto):
        return canonical(to_proto())
    if isinstance(value, ProtoMessage):
        return _proto(value)
    if isinstance(value, enum.Enum):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [canonical(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _proto(message: ProtoMessage) -> Json:
    if message.DESCRIPTOR.full_name == "google.protobuf.Timestamp":
        return message.ToJsonString()  # type: ignore[attr-defined]
    out: dict[str, Json] = {}
    for field in message.DESCRIPTOR.fields:
        raw = getattr(message, field.name)
        if field.is_repeated:
            out[field.name] = [_field(field, item) for item in raw]
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _field(field, raw)
    return out


def _field(field: Any, value: Any) -> Json:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _proto(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else value
    return value


# ---- values, substitution, paths, matchers -------------------------------------------------------


def lookup(value: Json, path: str) -> Json:
    """`value` at a dot-separated path of keys and list indexes; `length` is a list's or string's length."""
    for part in path.split(".") if path else []:
        if part == "length" and isinstance(value, list | str):
            value = len(value)
        elif isinstance(value, list):
            value = value[int(part)]
        elif isinstance(value, dict):
            if part not in value:
                raise KeyError(f"no {part!r} in {sorted(value)} (path {path!r})")
            value = value[part]
        else:
            raise KeyError(f"cannot take {part!r} of {value!r} (path {path!r})")
    return value


def resolve(value: Json, saved: Mapping[str, Json]) -> Json:
    """Generated values and `$name.path` references replaced, recursively."""
    if isinstance(value, str) and value.startswith("$"):
        name, _, path = value[1:].partition(".")
        if name not in saved:
            raise KeyError(f"nothing saved as {name!r} (have {sorted(saved)})")
        return lookup(saved[name], path)
    if isinstance(value, list):
        return [resolve(v, saved) for v in value]
    if isinstance(value, dict):
        if "$repeat" in value:
            return str(value["$repeat"]) * int(value["times"])
        if "$json" in value:
            return json.dumps(resolve(value["$json"], saved))
        if "$tool_definitions" in value:
            return tool_definitions(value["$tool_definitions"])
        return {k: resolve(v, saved) for k, v in value.items()}
    return value


def _short(value: Json) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 600 else f"{text[:300]} ... {text[-300:]}"


def check(actual: Json, matcher: Json, saved: Mapping[str, Json], where: str) -> None:
    if isinstance(matcher, dict) and len(matcher) == 1:
        ((kind, expected),) = matcher.items()
        if kind == "contains":
            assert isinstance(actual, str) and expected in actual, (
                f"{where}: {_short(actual)} does not contain {expected!r}"
            )
            return
        if kind == "matches":
            assert isinstance(actual, str) and re.search(expected, actual), f"{where}: {_short(actual)} !~ {expected!r}"
            return
        if kind == "gte":
            assert actual >= expected, f"{where}: {actual!r} < {expected!r}"
            return
        if kind == "lte":
            assert actual <= expected, f"{where}: {actual!r} > {expected!r}"
            return
        if kind == "present":
            present = actual not in (None, "", 0, [], {}, False)
            assert present == expected, f"{where}: {actual!r} is {'' if present else 'not '}present"
            return
        if kind == "equals_saved":
            wanted = resolve(expected, saved)
            assert actual == wanted, f"{where}: {actual!r} != {wanted!r} ({expected})"
            return
    assert actual == matcher, f"{where}: {_short(actual)} != {_short(matcher)}"


def check_all(result: Json, expect: Mapping[str, Json], saved: Mapping[str, Json], where: str) -> None:
    for path, matcher in expect.items():
        try:
            actual = lookup(result, path)
        except (KeyError, IndexError, ValueError) as exc:
            if matcher == {"present": False}:  # an absent key is not present
                continue
            raise AssertionError(f"{where} {path}: {exc}; result: {_short(result)}") from None
        check(actual, matcher, saved, f"{where} {path}")
