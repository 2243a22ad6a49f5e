"""What the gateway tests share: a ctxfold server on SQLite, the fake upstream, a gateway between."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest
from ctxfold_client import AsyncClient, Message

from conftest import fresh_database, settings_for
from ctxfold.gateway.app import RunningGateway, start_gateway
from ctxfold.gateway.settings import GatewaySettings
from ctxfold.server import RunningServer, start
from fake_upstream import FakeUpstream


@dataclass
class Stack:
    server: RunningServer
    upstream: FakeUpstream
    gateway: RunningGateway
    ctxfold: AsyncClient

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}"

    async def transcript(self, session_id: str, include_abandoned: bool = False) -> list[Message]:
        return [m async for m in self.ctxfold.list_messages(session_id, include_abandoned=include_abandoned)]


def gateway_settings(server_port: int, upstream: FakeUpstream, **overrides: object) -> GatewaySettings:
    return GatewaySettings(
        listen="127.0.0.1:0",
        server=f"127.0.0.1:{server_port}",
        openai_base_url=upstream.base_url,
        anthropic_base_url=upstream.base_url,
        **overrides,  # type: ignore[arg-type]
    )


async def make_stack(tmp: Path, **overrides: object) -> AsyncIterator[Stack]:
    server = await start(settings_for(await fresh_database("sqlite", tmp)))
    upstream = FakeUpstream()
    await upstream.start()
    gateway = await start_gateway(gateway_settings(server.port, upstream, **overrides))
    running = Stack(server, upstream, gateway, AsyncClient(f"127.0.0.1:{server.port}"))
    try:
        yield running
    finally:  # what runs at the end: a test may have restarted the gateway or the server
        await running.ctxfold.close()
        await running.gateway.stop()
        await upstream.stop()
        await running.server.stop(grace=0.5)


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async for running in make_stack(tmp_path_factory.mktemp("gateway")):
        yield running


def openai_agent(url: str, session: str = "", api_key: str = "sk-test", window: int = 0) -> openai.AsyncOpenAI:
    """The official openai SDK pointed at the gateway at `url`, naming its session and window by header when
    given, never retrying (a test sees each answer)."""
    headers = {"x-ctxfold-session": session} if session else {}
    if window:
        headers["x-ctxfold-context-window"] = str(window)
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, default_headers=headers, max_retries=0)


def anthropic_agent(url: str, session: str, api_key: str = "sk-ant-test", window: int = 0) -> anthropic.AsyncAnthropic:
    """The official anthropic SDK pointed at the gateway at `url`, as `openai_agent`."""
    headers = {"x-ctxfold-session": session}
    if window:
        headers["x-ctxfold-context-window"] = str(window)
    return anthropic.AsyncAnthropic(base_url=url, api_key=api_key, default_headers=headers, max_retries=0)
