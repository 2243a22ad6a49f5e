"""The gateway's process: its aiohttp application and client session started on one loop
(`start_gateway`, also what `serve --gateway-listen` embeds), and `ctxfold gateway` serving until it
is told to stop (`serve_gateway`). Requests are handled in `handler`."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from ctxfold import __version__, memory
from ctxfold.gateway.handler import Gateway
from ctxfold.gateway.settings import GatewaySettings
from ctxfold.gateway.upstream import Upstream

log = logging.getLogger("ctxfold.gateway")


@dataclass
class RunningGateway:
    port: int
    runner: web.AppRunner
    gateway: Gateway
    session: aiohttp.ClientSession

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.gateway.close()
        await self.session.close()


def listen_address(listen: str, port: int) -> str:
    return f"{listen.rpartition(':')[0] or '0.0.0.0'}:{port}"


async def serve_gateway(settings: GatewaySettings) -> None:
    """`ctxfold gateway`: serves until SIGTERM or SIGINT, then lets requests in flight finish."""
    running = await start_gateway(settings)
    memory.tune_collector()
    log.info(
        "ctxfold gateway %s serving on %s (ctxfold at %s; OpenAI upstream %s, Anthropic upstream %s; fail %s)",
        __version__,
        listen_address(settings.listen, running.port),
        settings.server,
        settings.openai_base_url,
        settings.anthropic_base_url,
        settings.fail_mode,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await running.stop()
    log.info("stopped")


async def start_gateway(settings: GatewaySettings) -> RunningGateway:
    host, _, port = settings.listen.rpartition(":")
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        auto_decompress=False,
    )
    gateway = Gateway(settings, Upstream(session))
    runner = web.AppRunner(gateway.application(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host.strip("[]") or "127.0.0.1", int(port))
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        await session.close()
        raise
    bound = int(runner.addresses[0][1])
    return RunningGateway(bound, runner, gateway, session)
