"""One server span per ContextService RPC, attached in one place: this interceptor.

It continues the caller's W3C trace (a `traceparent` in the metadata) and names the span after the
method. The servicer's one wrapper, which decodes every request, puts the session id and the
request's domain fields (and the response's, for unary RPCs) on it (`annotate_request`,
`annotate_response`). Errors are marked by the servicer's error mapping (`mark_error`), which
alone knows the ErrorInfo reason: status ERROR, the reason, and one exception event.

Why not opentelemetry-instrumentation-grpc: it records every abort twice ("Locally aborted."),
leaves the status of client errors unset, and keeps its context attached across a stream's yields,
so a client that cancels a stream logs "Failed to detach context" tracebacks. Here the span's
context is attached only while the handler runs, never across a yield."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from ctxfold.engine.errors import DomainError
from ctxfold.telemetry import TRACER

SERVICE_PREFIX = "/ctxfold.v1.ContextService/"
_SCALARS = {
    FieldDescriptor.TYPE_BOOL,
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_DOUBLE,
    FieldDescriptor.TYPE_FLOAT,
    FieldDescriptor.TYPE_ENUM,
}


def _identifier(name: str) -> bool:
    # Of the string fields only identifiers go on spans: no content, no free text, no page cursors.
    return name.endswith("_id") or name.endswith("_ref")


@functools.cache
def _attribute_fields(descriptor: Descriptor) -> tuple[tuple[str, str], ...]:
    """(field name, how it goes on a span) for the fields of a message type that do: `count` for
    repeated fields, `session` for session_id, `identifier` for other ids, `scalar` for numbers,
    flags and enums. Derived once per message type: it is the same for every call."""
    fields: list[tuple[str, str]] = []
    for field in descriptor.fields:
        if field.is_repeated:
            fields.append((field.name, "count"))
        elif field.name == "session_id":
            fields.append((field.name, "session"))
        elif field.type == FieldDescriptor.TYPE_STRING:
            if _identifier(field.name):
                fields.append((field.name, "identifier"))
        elif field.type in _SCALARS:
            fields.append((field.name, "scalar"))
    return tuple(fields)


def message_attributes(message: Message, prefix: str) -> dict[str, AttributeValue]:
    """The domain fields of a request or response as span attributes: numbers, flags, enums and ids
    (`prefix.<field>`), the sizes of repeated fields (`prefix.<field>.count`), and `session_id` as
    `ctxfold.session.id`."""
    attributes: dict[str, AttributeValue] = {}
    # Only the fields used are read: reading a string field copies it (a content can be MiBs).
    for name, kind in _attribute_fields(message.DESCRIPTOR):
        value = getattr(message, name)
        if kind == "count":
            attributes[f"{prefix}.{name}.count"] = len(value)
        elif kind == "scalar":
            attributes[f"{prefix}.{name}"] = value
        elif value:
            attributes["ctxfold.session.id" if kind == "session" else f"{prefix}.{name}"] = value
    return attributes


def response_attributes(request: Message, response: Message) -> dict[str, AttributeValue]:
    """The response's domain fields; a response naming a session (CreateSession, Fork, …) gives the
    span its session id when the request had none, else `ctxfold.response.session.id` (Fork)."""
    attributes = message_attributes(response, "ctxfold.response")
    if "session" in response.DESCRIPTOR.fields_by_name and response.HasField("session"):
        session_id = response.session.id  # type: ignore[attr-defined]
        if not getattr(request, "session_id", ""):
            attributes["ctxfold.session.id"] = session_id
        elif session_id != request.session_id:  # type: ignore[attr-defined]
            attributes["ctxfold.response.session.id"] = session_id
    return attributes


def annotate_request(request: Message) -> None:
    """Puts the decoded request's domain fields on the current RPC span (the servicer decodes requests
    itself, so this is where they are first seen)."""
    span = trace.get_current_span()
    if span.is_recording():  # attributes of a span that is not recorded are dropped: not built
        span.set_attributes(message_attributes(request, "ctxfold.request"))


def annotate_response(request: Message, response: Message, counts: Mapping[str, int] | None = None) -> None:
    """`counts` gives the sizes of repeated fields the response is serialized without (in parts)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    attributes = response_attributes(request, response)
    attributes |= {f"ctxfold.response.{name}.count": count for name, count in (counts or {}).items()}
    span.set_attributes(attributes)


def mark_error(error: DomainError, exc: BaseException) -> None:
    """Marks the current RPC span as failed with `error`'s reason: the servicer's one error path calls it."""
    span = trace.get_current_span()
    span.set_status(Status(StatusCode.ERROR, error.message))
    span.set_attributes({"ctxfold.error.reason": error.reason, "error.type": error.reason})
    span.record_exception(exc)


def peer_attributes(peer: str) -> dict[str, AttributeValue]:
    """`network.peer.*` from gRPC's peer string ("ipv4:127.0.0.1:50000", "ipv6:[::1]:50000", "unix:…")."""
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return {"network.transport": "unix"} if kind == "unix" else {}
    host, _, port = address.rpartition(":")
    return {"network.peer.address": host.strip("[]"), "network.peer.port": int(port) if port.isdigit() else 0}


def _status_code(context: grpc.aio.ServicerContext[Any, Any]) -> int:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return int(code.value[0])
    return int(code or 0)


class _RpcSpan:
    """The span of one RPC and the context the handler runs in."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext[Any, Any]):
        carrier: Mapping[str, str | bytes] = dict(context.invocation_metadata() or ())
        parent = propagate.extract(carrier)
        service, _, name = method.lstrip("/").partition("/")
        self.span: Span = TRACER.start_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": service,
                "rpc.method": name,
                **peer_attributes(context.peer() or ""),
            },
        )
        self.context = trace.set_span_in_context(self.span, parent)
        self.grpc = context

    async def run(self, step: Awaitable[Any]) -> Any:
        """Awaits one step of the handler with the span current (attached and detached in one task)."""
        token = otel_context.attach(self.context)
        try:
            return await step
        finally:
            otel_context.detach(token)

    def unexpected(self, exc: BaseException) -> None:
        # DomainErrors were marked by the servicer; anything reaching here escaped it.
        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))

    def end(self, cancelled: bool = False) -> None:
        code = grpc.StatusCode.CANCELLED.value[0] if cancelled else _status_code(self.grpc)
        self.span.set_attribute("rpc.grpc.status_code", code)
        self.span.end()


Unary = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
Streaming = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncGenerator[Any, None]]


def _traced_unary(method: str, behavior: Unary) -> Unary:
    async def handler(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        rpc = _RpcSpan(method, context)
        cancelled = False
        try:
            return await rpc.run(behavior(request, context))
        except asyncio.CancelledError:
            cancelled = True
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            rpc.unexpected(exc)
            raise
        finally:
            rpc.end(cancelled)

    return handler


def _traced_stream(method: str, behavior: Streaming) -> Streaming:
    async def handler(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncGenerator[Any, None]:
        rpc = _RpcSpan(method, context)
        responses = behavior(request, context)
        cancelled = False
        try:
            while True:
                try:
                    response = await rpc.run(anext(responses))
                except StopAsyncIteration:
                    break
                yield response  # nothing attached here: the consumer may close us from another context
        except (asyncio.CancelledError, GeneratorExit):
            cancelled = True
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            rpc.unexpected(exc)
            raise
        finally:
            await responses.aclose()
            rpc.end(cancelled)

    return handler


class TracingInterceptor(grpc.aio.ServerInterceptor):
    """Traces the ContextService RPCs (health checks and reflection stay untraced: they are noise)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith(SERVICE_PREFIX):
            return handler
        # The aio server hands coroutine functions and async generators here; grpc's stubs type the
        # sync server's callables.
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _traced_unary(method, handler.unary_unary),  # type: ignore[arg-type]
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _traced_stream(method, handler.unary_stream),  # type: ignore[arg-type]
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # the service has no client-streaming RPCs
