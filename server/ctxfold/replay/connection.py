"""Where a replay's calls go: a ctxfold server embedded in this process, or a channel to a running
one (TLS with a CA bundle)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from ctxfold.replay.options import ReplayError

CONNECT_TIMEOUT_SECONDS = 10.0
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


@contextlib.asynccontextmanager
async def embedded_server(summarizers: str = "") -> AsyncIterator[str]:
    """A ctxfold server in this process on a temporary SQLite database; yields its address."""
    from ctxfold.config import Settings
    from ctxfold.server import start

    with tempfile.TemporaryDirectory(prefix="ctxfold-replay-") as tmp:
        settings = Settings(
            listen="127.0.0.1:0",
            database=f"sqlite:///{Path(tmp) / 'replay.db'}",
            summarizers=summarizers,
            grace_seconds=1.0,
            log_level="WARNING",
        )
        running = await start(settings)
        try:
            yield f"127.0.0.1:{running.port}"
        finally:
            await running.stop(grace=1.0)


@contextlib.asynccontextmanager
async def channel_to(address: str, tls_ca: str = "") -> AsyncIterator[grpc.aio.Channel]:
    if tls_ca:
        try:
            root = await asyncio.to_thread(Path(tls_ca).read_bytes)
        except OSError as exc:
            raise ReplayError(f"cannot read {tls_ca}: {exc.strerror or exc}") from None
        channel = grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(root), options=CHANNEL_OPTIONS)
    else:
        channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    async with channel:
        yield channel
