"""Tenants through the gateway: the tenants file maps the SHA-256 of an agent's API key to a ctxfold
token, the `x-ctxfold-token` header names one; the server validates them like any bearer token, and
no session is reachable across tenants or API keys."""

from __future__ import annotations

import gc
import hashlib
from pathlib import Path

import grpc
import openai
import pytest
from ctxfold_client import AsyncClient, CtxfoldError, ErrorReason

from conftest import fresh_database, settings_for
from ctxfold.gateway.app import start_gateway
from ctxfold.gateway.contexts import credentials
from ctxfold.server import start
from fake_upstream import FakeUpstream
from gateway_fixtures import gateway_settings

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]


def channels() -> int:
    """The gRPC channels open in this process (the gateway's to ctxfold, here)."""
    return sum(isinstance(o, grpc.aio.Channel) for o in gc.get_objects())


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


async def test_many_tokens_share_one_channel_to_ctxfold(tmp_path: Path) -> None:
    """Every `x-ctxfold-token` a caller sends (valid, forged or malformed) is one call's credential on the
    gateway's one channel to ctxfold: it holds no client per token (a channel and a view cache, ~20 kB each,
    kept for good), so callers rotating tokens cannot make it grow without bound."""
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-aaaaaaaaaaaaaaaaaaaa tenant-a\n")
    server = await start(settings_for(await fresh_database("sqlite", tmp_path), auth_tokens_file=str(tokens)))
    upstream = FakeUpstream()
    await upstream.start()
    gateway = await start_gateway(gateway_settings(server.port, upstream))
    url = f"http://127.0.0.1:{gateway.port}/v1"
    channels_before = channels()
    try:
        agent = openai.AsyncOpenAI(base_url=url, api_key="sk-rotating", max_retries=0)
        warnings = []
        for number in range(60):
            token = "tok-aaaaaaaaaaaaaaaaaaaa" if number % 2 else f"forged-{number}"
            if number % 10 == 5:
                token = "two words"  # malformed: not even a bearer token
            answer = await agent.chat.completions.with_raw_response.create(
                model="gpt-4.1",
                messages=MESSAGES,
                extra_headers={"x-ctxfold-token": token},  # type: ignore[arg-type]
            )
            warnings.append(answer.headers.get("x-ctxfold-warning", ""))
        refused = [n for n, warning in enumerate(warnings) if "UNAUTHENTICATED" in warning]
        assert refused == [n for n in range(60) if n % 2 == 0 or n % 10 == 5], warnings
        async with AsyncClient(f"127.0.0.1:{server.port}", token="tok-aaaaaaaaaaaaaaaaaaaa") as client:
            assert len([s async for s in client.list_sessions()]) == 1
        assert channels() - channels_before <= 1  # the gateway's one channel, for every token
    finally:
        await gateway.stop()
        await upstream.stop()
        await server.stop(grace=0.5)


@pytest.mark.parametrize("token", ["tök-aaaaaaaaaaaaaaaaaaaa", "tok\x00", "tok\nx-other: 1"])
def test_a_token_that_cannot_be_a_bearer_token_is_refused_before_any_call(token: str) -> None:
    with pytest.raises(CtxfoldError) as refused:
        credentials(token)
    assert refused.value.reason == ErrorReason.UNAUTHENTICATED


def test_a_call_of_the_single_tenant_carries_no_token_and_another_its_own() -> None:
    assert credentials("") == {}
    assert credentials("tok-a b") == {"metadata": (("authorization", "Bearer tok-a b"),)}  # the server judges it
