"""One span per gateway request, with the GenAI semantic conventions, continuing the agent's
`traceparent`, parenting the Prepare RPC (through the SDK's trace propagation) and the upstream call;
`x-ctxfold-*` response headers say what ctxfold did."""

from __future__ import annotations

from typing import Any

import openai
from ctxfold_client import Message, Role
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fake_upstream import CHAT
from gateway_fixtures import Stack, stack
from test_telemetry import spans

__all__ = ["spans", "stack"]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


async def test_a_request_is_one_span_continuing_the_agents_trace(stack: Stack, spans: InMemorySpanExporter) -> None:
    spans.clear()
    agent = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="sk-otel", max_retries=0,
                               default_headers={"traceparent": TRACEPARENT, "x-ctxfold-session": "otel"})  # fmt: skip
    raw = await agent.chat.completions.with_raw_response.create(
        model="gpt-4.1", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    )
    finished = spans.get_finished_spans()
    gateway = next(s for s in finished if s.name == "chat gpt-4.1")
    assert format(gateway.context.trace_id, "032x") == TRACE_ID
    assert gateway.parent is not None and format(gateway.parent.span_id, "016x") == "00f067aa0ba902b7"
    attributes = dict(gateway.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "gpt-4.1"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.conversation.id"] == raw.headers["x-ctxfold-session"]
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["ctxfold.action"] == raw.headers["x-ctxfold-action"] == "none"
    assert attributes["ctxfold.view_tokens"] == int(raw.headers["x-ctxfold-view-tokens"])
    children = [s for s in finished if s.parent is not None and s.parent.span_id == gateway.context.span_id]
    names = {s.name for s in children}
    assert "POST upstream" in names
    assert any("Prepare" in name for name in names), names
    upstream_headers = stack.upstream.last("/v1/chat/completions").headers
    assert TRACE_ID in upstream_headers["traceparent"]


LONG_SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 12}  # past a bucket's first bytes


def gateway_span(spans: InMemorySpanExporter) -> tuple[ReadableSpan, list[ReadableSpan]]:
    """The last gateway request's span and its children."""
    finished = spans.get_finished_spans()
    gateway = [s for s in finished if s.name == "chat gpt-4.1"][-1]
    return gateway, [s for s in finished if s.parent is not None and s.parent.span_id == gateway.context.span_id]


async def test_an_appended_turn_goes_upstream_while_its_prepare_runs(stack: Stack, spans: InMemorySpanExporter) -> None:
    agent = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="sk-otel", max_retries=0,
                               default_headers={"x-ctxfold-session": "early"})  # fmt: skip
    history: list[Any] = [LONG_SYSTEM, {"role": "user", "content": "Fix a.py"}]
    await agent.chat.completions.create(model="gpt-4.1", messages=history)
    for turn, stream in enumerate((False, False, True, True)):  # the first streamed request changes a field
        history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"and {turn}.py"}]
        spans.clear()
        streamed = {"stream": True} if stream else {}
        answer = await agent.chat.completions.create(model="gpt-4.1", messages=history, **streamed)  # type: ignore[call-overload]
        if stream:
            assert "".join([c.choices[0].delta.content or "" async for c in answer if c.choices])
        gateway, children = gateway_span(spans)
        early = dict(gateway.attributes or {}).get("ctxfold.gateway.early_call")
        assert early == (None if turn == 2 else "used"), turn
        upstream = next(s for s in children if s.name == "POST upstream")
        prepare = next(s for s in children if "Prepare" in s.name)
        assert upstream.start_time is not None and prepare.end_time is not None
        assert (upstream.start_time < prepare.end_time) == (early == "used")  # sent before the Prepare answered
        assert stack.upstream.last(CHAT).body["messages"] == history


async def test_an_early_call_the_prepare_does_not_confirm_is_dropped(stack: Stack, spans: InMemorySpanExporter) -> None:
    """Another client appends between two turns: the turn is recognized by its bytes and sent early,
    but the transcript moved, so the gateway reconciles and the upstream gets the agent's history."""
    agent = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="sk-otel", max_retries=0,
                               default_headers={"x-ctxfold-session": "early-dropped"})  # fmt: skip
    history: list[Any] = [LONG_SYSTEM, {"role": "user", "content": "Fix a.py"}]
    raw = await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=history)
    session_id = raw.headers["x-ctxfold-session"]
    await stack.ctxfold.prepare(session_id, [Message(role=Role.USER, content="from another client")])
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and b.py"}]
    spans.clear()
    answer = await agent.chat.completions.create(model="gpt-4.1", messages=history)
    gateway, _ = gateway_span(spans)
    assert dict(gateway.attributes or {})["ctxfold.gateway.early_call"] == "dropped"
    assert answer.choices[0].message.content  # the answer to the request that went on
    assert stack.upstream.last(CHAT).body["messages"] == history
    assert [m.content for m in await stack.transcript(session_id)] == [m["content"] for m in history]
