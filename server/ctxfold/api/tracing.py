"""One server span per ContextService RPC, attached in one place: `traced`, which wraps every handler when
the servicer is registered. See docs/architecture.md, The API shell, and docs/observability.md."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from ctxfold.engine.answer import PreparedContext
from ctxfold.engine.errors import DomainError
from ctxfold.engine.maintenance import NotFolded
from ctxfold.engine.state import split_view_version
from ctxfold.telemetry import INSTRUMENTS, TRACER


@functools.cache
def _attribute_fields(descriptor: Descriptor, prefix: str) -> tuple[tuple[str, str, str], ...]:
    """(field name, attribute, kind) for each field of a message type that goes on a span, once a type: `count` for
    repeated fields (`.count`), `id` for session_id (`ctxfold.session.id`) and other ids, `scalar` for the rest."""
    fields: list[tuple[str, str, str]] = []
    for field in descriptor.fields:
        if field.is_repeated:
            fields.append((field.name, f"{prefix}.{field.name}.count", "count"))
        elif field.name == "session_id":
            fields.append((field.name, "ctxfold.session.id", "id"))
        elif field.type == FieldDescriptor.TYPE_STRING:
            # Of the string fields only identifiers go on spans: no content, no free text, no page cursors.
            if field.name.endswith(("_id", "_ref")):
                fields.append((field.name, f"{prefix}.{field.name}", "id"))
        elif field.cpp_type not in (FieldDescriptor.CPPTYPE_STRING, FieldDescriptor.CPPTYPE_MESSAGE):
            fields.append((field.name, f"{prefix}.{field.name}", "scalar"))  # numbers, flags, enums
    return tuple(fields)


# The codes that mean the server failed, the rest are the caller's: a server span is ERROR for these only (OTel RPC).
_C = grpc.StatusCode
SERVER_ERRORS = {_C.UNKNOWN, _C.DEADLINE_EXCEEDED, _C.UNIMPLEMENTED, _C.INTERNAL, _C.UNAVAILABLE, _C.DATA_LOSS}


def message_attributes(message: Message, prefix: str, sent_only: bool = False) -> dict[str, AttributeValue]:
    """A message's domain fields as span attributes: `prefix.<field>` (numbers, flags, enums, ids), repeated fields'
    sizes (`.count`), `ctxfold.session.id`; `sent_only` (requests) drops proto3 defaults (fields not set)."""
    attributes: dict[str, AttributeValue] = {}
    # Only the fields used are read: reading a string field copies it (a content can be MiBs).
    for name, attribute, kind in _attribute_fields(message.DESCRIPTOR, prefix):
        value = getattr(message, name)
        if value or (kind != "id" and not sent_only):  # an unset id is never shown
            attributes[attribute] = len(value) if kind == "count" else value
    return attributes


def annotate_request(request: Message) -> None:
    """The decoded request's domain fields on the current RPC span (the servicer decodes, so first seen here)."""
    span = trace.get_current_span()
    if span.is_recording():  # attributes of a span that is not recorded are dropped: not built
        span.set_attributes(message_attributes(request, "ctxfold.request", sent_only=True))


def annotate_tenant(tenant: str) -> None:
    """The authenticated caller's tenant (its name, never its token) on the current RPC span."""
    trace.get_current_span().set_attribute("ctxfold.tenant", tenant)


def annotate_response(request: Message, response: Message, counts: Mapping[str, int] | None = None) -> None:
    """The response's domain fields and `counts` (sizes of repeated fields serialized apart); a response naming a
    session gives the span its session id when the request had none, else `ctxfold.response.session.id` (Fork)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    attributes = message_attributes(response, "ctxfold.response")
    if "session" in response.DESCRIPTOR.fields_by_name and response.HasField("session"):
        session_id = response.session.id  # type: ignore[attr-defined]
        if not getattr(request, "session_id", ""):
            attributes["ctxfold.session.id"] = session_id
        elif session_id != request.session_id:  # type: ignore[attr-defined]
            attributes["ctxfold.response.session.id"] = session_id
    attributes |= {f"ctxfold.response.{name}.count": count for name, count in (counts or {}).items()}
    span.set_attributes(attributes)


def annotate_answer(prepared: PreparedContext, operation: str, started: float) -> None:
    """The answered view of a Prepare or Compact, as its bookkeeping state recorded it (the installed view,
    also on a dry run), why a call that had to fold (or was asked to) folded nothing, and its duration."""
    state, action = prepared.state, prepared.action
    span = trace.get_current_span()
    if span.is_recording():
        version = state.views[-1].version
        attributes: dict[str, AttributeValue] = {
            "ctxfold.view.version": version,
            "ctxfold.view.messages": split_view_version(version)[1],
            "ctxfold.tokens.before": state.source_tokens,
            "ctxfold.tokens.after": state.projection_tokens,
            "ctxfold.action": action.value,
            "ctxfold.cache_state": state.cache_state,
        }
        if prepared.not_folded is not NotFolded.UNSPECIFIED:
            attributes["ctxfold.not_folded.reason"] = prepared.not_folded.value
            attributes["ctxfold.not_folded.detail"] = prepared.not_folded_detail
        span.set_attributes(attributes)
    duration = time.perf_counter() - started
    INSTRUMENTS.prepare_duration.record(duration, {"ctxfold.operation": operation, "ctxfold.action": action.value})


def mark_error(error: DomainError, code: grpc.StatusCode, exc: BaseException) -> None:
    """`error`'s reason on the current RPC span (which ends with `code`); a server error also gets status ERROR,
    `error.type` and the exception event. The servicer's one error path calls it."""
    span = trace.get_current_span()
    span.set_attribute("ctxfold.error.reason", error.reason)
    if code in SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, error.message))
        span.set_attribute("error.type", error.reason)
        span.record_exception(exc)


def peer_attributes(peer: str) -> dict[str, AttributeValue]:
    """`network.peer.*` from gRPC's peer string ("ipv4:127.0.0.1:50000", "ipv6:[::1]:50000", "unix:…")."""
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return {"network.transport": "unix"} if kind == "unix" else {}
    host, _, port = address.rpartition(":")
    return {"network.peer.address": host.strip("[]"), "network.peer.port": int(port) if port.isdigit() else 0}


Handler = Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


def traced(method: str, behavior: Handler) -> Handler:
    """`behavior` (a handler of `method`, "package.Service/Method") inside the RPC's span, ended with the call's status;
    every handler is one coroutine in one task (streams too), so the context is attached and detached there."""

    service, _, name = method.partition("/")

    async def handler(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        # Without an SDK's provider every span is a no-op: an RPC's span (its parent context, its
        # attributes) is then not built at all. Asked per call: a provider may be installed at any time.
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return await behavior(request, context)
        carrier: Mapping[str, str | bytes] = dict(context.invocation_metadata() or ())
        parent = propagate.extract(carrier)
        rpc = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        attributes = rpc | peer_attributes(context.peer() or "")
        span = TRACER.start_span(method, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        code: grpc.StatusCode | int | None = None  # the call's, once it ends: a StatusCode or its number; None is OK
        try:
            return await behavior(request, context)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            # DomainErrors were marked by the servicer; anything reaching here escaped it (gRPC: UNKNOWN).
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            span.set_attribute("error.type", type(exc).__qualname__)
            raise
        finally:
            otel_context.detach(token)
            code = code or context.code()
            span.set_attribute("rpc.grpc.status_code", code.value[0] if isinstance(code, _C) else code or 0)
            span.end()

    return handler
