"""The constructor and the I/O-free parts shared by `Client` and `AsyncClient`."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Any, Generic, TypeVar

from ctxfold_client import _core as core
from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client._gen.enums import ErrorReason
from ctxfold_client.errors import CtxfoldError
from ctxfold_client.models import CallOptions, Message, View

ChannelT = TypeVar("ChannelT")


class ClientBase(abc.ABC, Generic[ChannelT]):
    """Connection options of both clients.

    Args:
        address: the server, "host:port" (any gRPC target works, e.g. "dns:///ctxfold:50051").
        token: bearer token; sent as `authorization: Bearer TOKEN` on every call.
        tls: use TLS. Implied by `ca_cert`, `client_cert` or `server_name`; the system roots are
            used without `ca_cert`.
        ca_cert: PEM of the CA that signed the server certificate (bytes, PEM text or a path).
        client_cert, client_key: PEM certificate chain and key of this client, for mutual TLS.
        server_name: the name to verify in the server certificate, when it differs from `address`.
        timeout: default deadline in seconds of unary calls (None = none).
        stream_timeout: default deadline of Prepare and Compact streams, which may fold (None = none).
        metadata: extra gRPC metadata sent on every call.
        channel_options: extra gRPC channel options.
        propagate_trace: inject the active OpenTelemetry trace context (when opentelemetry-api is
            importable) into every call.
        view_cache_size: sessions whose last view is kept to receive Prepare results as deltas
            (0 = always ask for whole views).
        channel: use this channel instead of opening one (the connection options are then unused;
            the client does not close it).
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls: bool | None = None,
        ca_cert: core.PemSource | None = None,
        client_cert: core.PemSource | None = None,
        client_key: core.PemSource | None = None,
        server_name: str | None = None,
        timeout: float | None = core.DEFAULT_TIMEOUT,
        stream_timeout: float | None = core.DEFAULT_STREAM_TIMEOUT,
        metadata: Sequence[tuple[str, str]] = (),
        channel_options: Sequence[tuple[str, Any]] = (),
        propagate_trace: bool = True,
        view_cache_size: int = core.DEFAULT_VIEW_CACHE_SIZE,
        channel: ChannelT | None = None,
    ) -> None:
        self._settings = core.make_settings(
            address,
            token=token,
            tls=tls,
            ca_cert=ca_cert,
            client_cert=client_cert,
            client_key=client_key,
            server_name=server_name,
            timeout=timeout,
            stream_timeout=stream_timeout,
            metadata=metadata,
            channel_options=channel_options,
            propagate_trace=propagate_trace,
        )
        if view_cache_size < 0:
            raise CtxfoldError.invalid_argument(
                ErrorReason.INVALID_CLIENT_ARGUMENT,
                "view_cache_size",
                f"view_cache_size must be >= 0, not {view_cache_size}",
            )
        self._views = core.ViewCache(view_cache_size)
        self._owns_channel = channel is None
        self._connect(channel if channel is not None else self._open_channel(self._settings))

    @abc.abstractmethod
    def _open_channel(self, settings: core.Settings) -> ChannelT: ...

    @abc.abstractmethod
    def _connect(self, channel: ChannelT) -> None: ...

    @property
    def address(self) -> str:
        return self._settings.target

    def forget_view(self, session_id: str | None = None) -> None:
        """Drops the view kept for `session_id` (all sessions without it): the next Prepare
        answers with the whole view."""
        if session_id is None:
            self._views.clear()
        else:
            self._views.forget(session_id)

    def last_view(self, session_id: str) -> View | None:
        """The last whole view this client holds for `session_id` (None after eviction)."""
        known = self._views.get(session_id)
        return known.view if known is not None else None

    def _args(self, call: CallOptions, *, streaming: bool = False) -> tuple[float | None, core.Metadata]:
        return core.call_args(self._settings, call, streaming=streaming)

    def _start_prepare(
        self, session_id: str, append: Iterable[Message], overflow: bool, request_id: str
    ) -> tuple[pb.PrepareRequest, core.FoldStream]:
        known = self._views.get(session_id)
        request = core.prepare_request(
            session_id,
            append,
            overflow=overflow,
            given_request_id=request_id,
            known_view_version=known.version if known is not None else 0,
        )
        return request, core.FoldStream(session_id, known, self._views)

    def _start_whole_view(self, delta: core.FoldStream) -> tuple[pb.PrepareRequest, core.FoldStream]:
        """The whole view after the delta of `delta` could not be applied; it keeps what that call appended."""
        self._views.forget(delta.session_id)
        stream = core.FoldStream(delta.session_id, None, self._views, delta.appended)
        return core.whole_view_request(delta.session_id), stream

    def _start_compact(
        self, session_id: str, focus: str, keep_tokens: int, dry_run: bool
    ) -> tuple[pb.CompactRequest, core.FoldStream]:
        request = core.compact_request(session_id, focus, keep_tokens, dry_run)
        # A dry run installed nothing: the view held (for deltas and context_budget) stays the last real one.
        return request, core.FoldStream(session_id, None, core.ViewCache(0) if dry_run else self._views)
