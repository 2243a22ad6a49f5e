"""One span per gateway request, with the GenAI semantic conventions, continuing the agent's
`traceparent`, parenting the Prepare RPC (through the SDK's trace propagation) and the upstream call;
`x-ctxfold-*` response headers say what ctxfold did."""

from __future__ import annotations

import openai
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

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
