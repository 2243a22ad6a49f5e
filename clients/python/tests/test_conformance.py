"""Every scenario of clients/conformance/scenarios as one test, against a real `ctxfold serve`."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from conformance import Json, canonical, check_all, fixture, load, resolve, scenario_files
from conftest import Server
from ctxfold_client import (
    AsyncClient,
    Client,
    CtxfoldError,
    Message,
    SessionConfig,
    Usage,
    View,
    adapters,
    tool_definitions,
)


def _messages(value: Json) -> list[Message]:
    return [Message.from_json(m) for m in value]


def _session_id(value: Json) -> str:
    return str(value["id"]) if isinstance(value, dict) else str(value)


def _view_version(value: Json) -> int:
    return int(value["view_version"]) if isinstance(value, dict) else int(value)


def _deleted(client: Client, session_id: str) -> dict[str, Json]:
    client.delete_session(session_id)
    return {}


def _events(events: Iterator[Any]) -> dict[str, Json]:
    progress, result = [], None
    for event in events:
        if hasattr(event, "view_version"):
            result = event
        else:
            progress.append(event)
    return {"progress": canonical(progress), "result": canonical(result)}


Op = Callable[[Client, str, dict[str, Json]], object]


def _config(args: dict[str, Json]) -> SessionConfig:
    config = SessionConfig.from_json(args.get("config", {}))
    return config.replace(tools=args["tools"]) if "tools" in args else config


OPS: Mapping[str, Op] = {
    "create_session": lambda c, s, a: c.create_session(_config(a)),
    "get_session": lambda c, s, a: c.get_session(s),
    "list_sessions": lambda c, s, a: {"sessions": list(c.list_sessions(page_size=a.get("page_size", 0)))},
    "delete_session": lambda c, s, a: _deleted(c, s),
    "append_messages": lambda c, s, a: {
        "messages": c.append_messages(s, _messages(a["messages"]), request_id=a.get("request_id", ""))
    },
    "list_messages": lambda c, s, a: {
        "messages": list(
            c.list_messages(s, include_abandoned=a.get("include_abandoned", False), page_size=a.get("page_size", 0))
        )
    },
    "prepare": lambda c, s, a: c.prepare(
        s, _messages(a.get("append", [])), overflow=a.get("overflow", False), request_id=a.get("request_id", "")
    ),
    "prepare_events": lambda c, s, a: _events(
        c.prepare_events(
            s, _messages(a.get("append", [])), overflow=a.get("overflow", False), request_id=a.get("request_id", "")
        )
    ),
    "compact": lambda c, s, a: c.compact(
        s, focus=a.get("focus", ""), keep_tokens=a.get("keep_tokens", 0), dry_run=a.get("dry_run", False)
    ),
    "compact_events": lambda c, s, a: _events(
        c.compact_events(
            s, focus=a.get("focus", ""), keep_tokens=a.get("keep_tokens", 0), dry_run=a.get("dry_run", False)
        )
    ),
    "observe_usage": lambda c, s, a: c.observe_usage(
        s,
        _view_version(a["view"]),
        Usage(
            input_tokens=a.get("input_tokens", 0),
            cached_input_tokens=a.get("cached_input_tokens", 0),
            output_tokens=a.get("output_tokens", 0),
            finish_reason=a.get("finish_reason", ""),
        ),
    ),
    "get_context_state": lambda c, s, a: c.get_context_state(s),
    "fork": lambda c, s, a: c.fork(
        s,
        at_seq=a.get("at_seq"),
        at_head=a.get("at_head", False),
        config=SessionConfig.from_json(a["config"]) if "config" in a else None,
    ),
    "rewind": lambda c, s, a: c.rewind(s, a["to_seq"]),
    "edit": lambda c, s, a: c.edit(s, a["seq"], Message.from_json(a["message"]), request_id=a.get("request_id", "")),
    "retry": lambda c, s, a: c.retry(s, a["answer_seq"]),
    "read_tool_result": lambda c, s, a: c.read_tool_result(
        s, result_ref=a.get("result_ref", ""), tool_call_id=a.get("tool_call_id", ""), page_bytes=a.get("page_bytes")
    ),
    "tool_result_pages": lambda c, s, a: {
        "pages": list(
            c.tool_result_pages(
                s,
                result_ref=a.get("result_ref", ""),
                tool_call_id=a.get("tool_call_id", ""),
                offset=a.get("offset", 0),
                page_bytes=a.get("page_bytes"),
            )
        )
    },
    "list_checkpoints": lambda c, s, a: {
        "checkpoints": list(
            c.list_checkpoints(s, include_abandoned=a.get("include_abandoned", False), page_size=a.get("page_size", 0))
        )
    },
    "get_checkpoint": lambda c, s, a: c.get_checkpoint(s, a["checkpoint_id"]),
    "dispatch_tool_call": lambda c, s, a: {"content": c.dispatch_tool_call(s, a["name"], a["arguments"])},
    "tool_definitions": lambda c, s, a: {"tools": tool_definitions(a["format"])},
    "to_openai_chat": lambda c, s, a: adapters.openai_chat.to_request(View.from_json(a["view"]), tools=a.get("tools")),
    "to_openai_responses": lambda c, s, a: adapters.openai_responses.to_request(
        View.from_json(a["view"]), tools=a.get("tools")
    ),
    "to_anthropic_messages": lambda c, s, a: adapters.anthropic_messages.to_request(
        View.from_json(a["view"]), tools=a.get("tools")
    ),
    "from_openai_chat": lambda c, s, a: adapters.openai_chat.from_response(fixture(a["fixture"])),
    "from_openai_responses": lambda c, s, a: adapters.openai_responses.from_response(fixture(a["fixture"])),
    "from_anthropic_messages": lambda c, s, a: adapters.anthropic_messages.from_response(fixture(a["fixture"])),
    "from_openai_chat_messages": lambda c, s, a: {"messages": adapters.openai_chat.from_messages(a["messages"])},
}


def run_scenario(client: Client, scenario: dict[str, Json]) -> None:
    saved: dict[str, Json] = {}
    if "config" in scenario:
        saved["session"] = canonical(client.create_session(SessionConfig.from_json(scenario["config"])))
    for index, step in enumerate(scenario["steps"]):
        op = OPS[step["op"]]
        args = resolve(step.get("args", {}), saved)
        session = _session_id(args.pop("session", saved.get("session", "")))
        where = f"step {index} ({step['op']})"
        for _ in range(step.get("repeat", 1)):
            if "error" in step:
                with pytest.raises(CtxfoldError) as raised:
                    op(client, session, args)
                error = raised.value
                failure = {"code": error.code.name, "reason": error.reason, "domain": error.domain}
                wanted = {"domain": error.domain, **step["error"]}
                assert failure == wanted, f"{where}: {error!r} ({error.domain})"
                continue
            result = canonical(op(client, session, args))
            check_all(result, step.get("expect", {}), saved, where)
            if "save" in step:
                saved[step["save"]] = result


class BlockingAsyncClient:
    """The AsyncClient driven from a test thread: every coroutine is run on a private event loop
    and every async iterator is read to its end, so the scenarios run through it as they are."""

    def __init__(self, address: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = self._loop.run_until_complete(self._open(address))

    @staticmethod
    async def _open(address: str) -> AsyncClient:
        return AsyncClient(address)

    def close(self) -> None:
        self._loop.run_until_complete(self._client.close())
        self._loop.close()

    def __getattr__(self, name: str) -> Callable[..., object]:
        method = getattr(self._client, name)

        def call(*args: object, **kwargs: object) -> object:
            result = method(*args, **kwargs)
            if inspect.isasyncgen(result):
                return self._loop.run_until_complete(_drain(result))
            if inspect.iscoroutine(result):
                return self._loop.run_until_complete(result)
            return result

        return call


async def _drain(items: AsyncIterator[object]) -> list[object]:
    return [item async for item in items]


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: p.stem)
def test_scenario(client: Client, path: Path) -> None:
    run_scenario(client, load(path))


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: p.stem)
def test_scenario_async(server: Server, path: Path) -> None:
    """The same scenario through AsyncClient (the blocking client is generated from it)."""
    bridge = BlockingAsyncClient(server.address)
    try:
        run_scenario(cast(Client, bridge), load(path))
    finally:
        bridge.close()


def test_every_scenario_operation_is_bound() -> None:
    used = {step["op"] for path in scenario_files() for step in load(path)["steps"]}
    assert used <= set(OPS), sorted(used - set(OPS))
