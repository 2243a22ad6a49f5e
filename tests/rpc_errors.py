"""Asserting on the errors the server returns: a gRPC status code plus a google.rpc.ErrorInfo detail."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

DOMAIN = "ctxfold.dev"


def error_info(exc: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo detail of a failed call (parsed from 'grpc-status-details-bin')."""
    status = rpc_status.from_call(exc)  # also checks code and message agree with the rich status
    assert status is not None, f"{exc.code()} {exc.details()!r} carries no google.rpc.Status"
    infos = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
    assert len(infos) == 1, f"expected exactly one ErrorInfo, got {status.details}"
    return infos[0]


async def expect_error(
    call: Awaitable[object],
    code: grpc.StatusCode,
    reason: str,
    metadata: Mapping[str, str] | None = None,
) -> error_details_pb2.ErrorInfo:
    """Awaits `call`, which must fail with `code` and an ErrorInfo of `reason` in the ctxfold domain
    (and carrying at least the given `metadata`); returns the ErrorInfo."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    exc = caught.value
    assert exc.code() == code, f"expected {code}, got {exc.code()}: {exc.details()}"
    assert exc.details(), "the status message must say what went wrong"
    info = error_info(exc)
    assert info.reason == reason, f"expected reason {reason}, got {info.reason}: {exc.details()}"
    assert info.domain == DOMAIN
    for key, value in (metadata or {}).items():
        assert info.metadata.get(key) == value, f"metadata {key}: {dict(info.metadata)}"
    return info
