"""Tenants through the gateway: the tenants file maps the SHA-256 of an agent's API key to a ctxfold
token, the `x-ctxfold-token` header names one; the server validates them like any bearer token, and
no session is reachable across tenants or API keys."""

from __future__ import annotations

import hashlib
from pathlib import Path

import openai
from ctxfold_client import AsyncClient

from conftest import fresh_database, settings_for
from ctxfold.gateway.app import start_gateway
from ctxfold.server import start
from fake_upstream import FakeUpstream
from gateway_fixtures import gateway_settings

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_tenants_come_from_the_key_map_or_the_header(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-aaaaaaaaaaaaaaaaaaaa tenant-a\ntok-bbbbbbbbbbbbbbbbbbbb tenant-b\n")
    tenants = tmp_path / "tenants"
    tenants.write_text(
        f"{sha256('sk-alice')} tok-aaaaaaaaaaaaaaaaaaaa\n# bob\n{sha256('sk-bob')} tok-bbbbbbbbbbbbbbbbbbbb\n"
    )
    server = await start(settings_for(await fresh_database("sqlite", tmp_path), auth_tokens_file=str(tokens)))
    upstream = FakeUpstream()
    await upstream.start()
    gateway = await start_gateway(gateway_settings(server.port, upstream, tenants_file=str(tenants)))
    url = f"http://127.0.0.1:{gateway.port}/v1"

    async def ask(api_key: str, **headers: str) -> openai.types.chat.ChatCompletion:
        agent = openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0,
                                   default_headers={"x-ctxfold-session": "same-name", **headers})  # fmt: skip
        return await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=MESSAGES)  # type: ignore[arg-type,return-value]

    try:
        alice, bob = await ask("sk-alice"), await ask("sk-bob")
        eve_as_b = await ask("sk-eve", **{"x-ctxfold-token": "tok-bbbbbbbbbbbbbbbbbbbb"})
        stranger = await ask("sk-stranger")  # no tenant: ctxfold refuses, the request goes on unchanged
        assert "UNAUTHENTICATED" in stranger.headers["x-ctxfold-warning"]  # type: ignore[attr-defined]
        for token, expected in (("tok-aaaaaaaaaaaaaaaaaaaa", [alice]), ("tok-bbbbbbbbbbbbbbbbbbbb", [bob, eve_as_b])):
            async with AsyncClient(f"127.0.0.1:{server.port}", token=token) as client:
                ids = {s.id async for s in client.list_sessions()}
            assert ids == {r.headers["x-ctxfold-session"] for r in expected}  # type: ignore[attr-defined]
        assert "tok-" not in upstream.last("/v1/chat/completions").raw.decode()
        assert not any(k.lower().startswith("x-ctxfold") for k in upstream.last("/v1/chat/completions").headers)
    finally:
        await gateway.stop()
        await upstream.stop()
        await server.stop(grace=0.5)
