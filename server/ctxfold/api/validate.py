"""Checks every request passes before its use case runs: a `session_id` field is set, and no text but a tool
result's holds a NUL character (why: docs/architecture.md, The API shell)."""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from ctxfold.engine.errors import invalid
from ctxfold.v1.context_service_pb2 import ROLE_TOOL


def check_request(request: Message, wire: bytes) -> None:
    """`wire`, the request's bytes, spares the field walk: a NUL in a string is a zero byte there; most have none."""
    where = _nul_field(request, "") if b"\x00" in wire else ""
    if where:
        raise invalid("INVALID_TEXT", f"{where} contains a NUL character (U+0000), which cannot be stored", field=where)
    if "session_id" in request.DESCRIPTOR.fields_by_name and not getattr(request, "session_id", ""):
        raise invalid("SESSION_ID_REQUIRED", "session_id is required", field="session_id")


def _nul_field(message: Message, prefix: str) -> str:
    """The path of the first string field holding a NUL character (a tool result's content excepted), or ""."""
    tool_result = message.DESCRIPTOR.full_name == "ctxfold.v1.Message" and getattr(message, "role", 0) == ROLE_TOOL
    for field, value in message.ListFields():
        values = list(value) if field.is_repeated else [value]
        for index, item in enumerate(values):
            path = f"{prefix}{field.name}" + (f"[{index}]" if field.is_repeated else "")
            if tool_result and field.name == "content":
                continue
            if field.type == FieldDescriptor.TYPE_STRING and "\x00" in item:
                return path
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                found = _nul_field(item, path + ".")
                if found:
                    return found
    return ""
