"""Summaries from Anthropic's Messages API, through the official SDK.

A cache breakpoint sits on the last block of the replayed prefix, so the fold request reads the
prefix the agent's own requests cached (cache reads match at earlier block boundaries too)."""

from __future__ import annotations

import json
import os
from typing import Any

import anthropic
import pydantic

from ctxfold.engine.errors import ConfigError
from ctxfold.summarizers import native
from ctxfold.summarizers.base import (
    ATTEMPT_HOOKS,
    DEFAULT_DEADLINE_SECONDS,
    INSTRUCTIONS,
    OnDelta,
    OutputBound,
    StreamedAnswer,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
    deadline,
    event_data,
    parsed,
)
from ctxfold.summarizers.chat_format import anthropic_messages

_EPHEMERAL = {"type": "ephemeral"}
PROVIDER = "anthropic"
# The Messages stream events by name (the SDK's union of them carries no discriminator pydantic uses,
# so a bad event would be reported against every member). Events of other names are skipped, as the
# SDK does (ping, and types added later).
_EVENTS: dict[str, pydantic.TypeAdapter[anthropic.types.RawMessageStreamEvent]] = {
    "message_start": pydantic.TypeAdapter(anthropic.types.RawMessageStartEvent),
    "content_block_start": pydantic.TypeAdapter(anthropic.types.RawContentBlockStartEvent),
    "content_block_delta": pydantic.TypeAdapter(anthropic.types.RawContentBlockDeltaEvent),
    "content_block_stop": pydantic.TypeAdapter(anthropic.types.RawContentBlockStopEvent),
    "message_delta": pydantic.TypeAdapter(anthropic.types.RawMessageDeltaEvent),
    "message_stop": pydantic.TypeAdapter(anthropic.types.RawMessageStopEvent),
}


class AnthropicSummarizer:
    provider = PROVIDER

    def __init__(
        self,
        name: str,
        client: anthropic.AsyncAnthropic,
        model: str,
        input_window_tokens: int,
        deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
        compaction: str = "summary",
    ):
        self.name = name
        self.client = client
        self.model = model
        self.server_address = client.base_url.host
        self.server_port = client.base_url.port or (443 if client.base_url.scheme == "https" else 80)
        self.input_window_tokens = input_window_tokens
        self.deadline_seconds = deadline_seconds
        self.compaction = compaction

    @classmethod
    def from_spec(cls, name: str, spec: dict[str, Any]) -> AnthropicSummarizer:
        model = spec.get("model")
        if not isinstance(model, str) or not model:
            raise ConfigError(f"summarizers.{name}: model is required")
        key_env = str(spec.get("api_key_env", "ANTHROPIC_API_KEY"))
        client = anthropic.AsyncAnthropic(
            base_url=spec.get("base_url") or None,
            api_key=os.environ.get(key_env) or "unused",
            timeout=float(spec.get("timeout_seconds", 120)),
            max_retries=int(spec.get("max_retries", 2)),
            http_client=anthropic.DefaultAsyncHttpxClient(event_hooks=ATTEMPT_HOOKS),
        )
        return cls(
            name,
            client,
            model,
            int(spec.get("input_window_tokens", 200_000)),
            float(spec.get("deadline_seconds", DEFAULT_DEADLINE_SECONDS)),
            native.mode(name, spec),
        )

    def build_request(self, request: SummaryRequest) -> dict[str, Any]:
        system_text, messages = anthropic_messages(request.prefix)
        if messages:
            messages[-1]["content"][-1]["cache_control"] = _EPHEMERAL
        messages.append({"role": "user", "content": [{"type": "text", "text": request.instruction()}]})
        if len(messages) >= 2 and messages[-2]["role"] == "user":
            # Keep roles alternating: the instruction joins the last user turn.
            messages[-2]["content"].extend(messages.pop()["content"])
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": request.max_tokens}
        if system_text:
            body["system"] = [{"type": "text", "text": system_text, "cache_control": _EPHEMERAL}]
        tools = json.loads(request.tools_json) if request.tools_json else []
        if tools:
            body["tools"] = tools
            body["tool_choice"] = {"type": "none"}
        return body

    async def summarize(self, request: SummaryRequest, on_delta: OnDelta | None = None) -> SummaryResult:
        compact, summary = (lambda: self._compact(request)), (lambda: self._summary(request, on_delta))
        return await native.compacted_or_summary(self.compaction, compact, summary)

    async def _summary(self, request: SummaryRequest, on_delta: OnDelta | None) -> SummaryResult:
        bound = OutputBound(request.max_tokens)
        try:
            async with (
                deadline(self.deadline_seconds),
                self.client.messages.with_streaming_response.create(
                    **self.build_request(request), stream=True
                ) as answer,
            ):
                result = await _read_stream(answer, bound, on_delta)
        except anthropic.AnthropicError as exc:
            raise SummarizerError(f"{type(exc).__name__}: {exc}") from exc
        return result

    async def _compact(self, request: SummaryRequest) -> SummaryResult:
        """The folded view with Anthropic's compaction edit, paused after compaction: its `compaction`
        block, whose `content` is the summary text."""
        tokens = sum(v.tokens for v in request.prefix)
        if tokens < native.ANTHROPIC_MIN_TRIGGER_TOKENS:
            raise native.Unsupported(
                f"the folded input ({tokens} tokens) is below the {native.ANTHROPIC_MIN_TRIGGER_TOKENS}-token "
                "minimum of Anthropic's compaction trigger"
            )
        edit = {
            "type": native.ANTHROPIC_EDIT,
            "trigger": {"type": "input_tokens", "value": native.ANTHROPIC_MIN_TRIGGER_TOKENS},
            "pause_after_compaction": True,
            "instructions": INSTRUCTIONS,
        }
        body: dict[str, Any] = {
            **self.build_request(request),
            "betas": [native.ANTHROPIC_BETA],
            "context_management": {"edits": [edit]},
        }
        try:
            async with deadline(self.deadline_seconds):
                raw = await self.client.beta.messages.with_raw_response.create(**body)
        except (anthropic.BadRequestError, anthropic.NotFoundError) as exc:
            raise native.unsupported_status(exc.status_code, exc.message) from None
        except anthropic.AnthropicError as exc:
            raise SummarizerError(f"{type(exc).__name__}: {exc}") from exc
        answer, block = native.compaction_of(raw.http_response.content, "content", PROVIDER)
        text = block.get("content")
        if not isinstance(text, str) or not text.strip():
            raise native.Unsupported("the compaction block holds no summary (the provider's compaction failed)")
        usage = answer.get("usage") or {}
        return SummaryResult(
            text=text,
            finish_reason="stop",
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cached_input_tokens=int(usage.get("cache_read_input_tokens") or 0),
            response_model=str(answer.get("model") or self.model),
            response_id=str(answer.get("id") or ""),
            native=native.payload(native.ANTHROPIC_MESSAGES, block),
        )


async def _read_stream(answer: StreamedAnswer, bound: OutputBound, on_delta: OnDelta | None) -> SummaryResult:
    """The summary from a Messages event stream, each event validated before it is used."""
    texts: dict[int, list[str]] = {}
    started: set[int] = set()
    start: anthropic.types.Message | None = None
    stop_reason: str | None = None
    output_tokens = 0
    async for name, data in event_data(answer, PROVIDER):
        if name == "error":
            raise SummarizerError(f"{PROVIDER}: the stream reported an error: {data[:200]}")
        if name not in _EVENTS:
            continue
        event = parsed(_EVENTS[name], data, PROVIDER, f"a {name} event")
        if event.type == "message_start":
            start, output_tokens = event.message, event.message.usage.output_tokens
        elif start is None:
            raise SummarizerError(f"{PROVIDER}: the stream sent {event.type} before message_start")
        elif event.type == "content_block_start":
            started.add(event.index)
            if event.content_block.type == "text":
                texts[event.index] = [event.content_block.text]
        elif event.type == "content_block_delta":
            if event.index not in started:
                raise SummarizerError(
                    f"{PROVIDER}: the stream sent a delta for content block {event.index}, never started"
                )
            if event.delta.type == "text_delta" and event.index in texts:
                bound.add(len(event.delta.text.encode()))
                texts[event.index].append(event.delta.text)
                if on_delta is not None:
                    await on_delta(event.delta.text)
        elif event.type == "message_delta":
            stop_reason, output_tokens = event.delta.stop_reason, event.usage.output_tokens
        elif event.type == "message_stop":
            break
    if start is None or stop_reason is None:
        # The stream ended before message_delta / message_stop: part of a summary, not a summary.
        raise SummarizerError("the summary stream ended without a stop_reason (incomplete)")
    text = "".join("".join(texts[index]) for index in sorted(texts))
    finish = "length" if stop_reason == "max_tokens" else "stop"
    usage = start.usage
    cached = usage.cache_read_input_tokens or 0
    # Anthropic reports uncached input apart from cache reads and writes; report the total read.
    total_input = usage.input_tokens + cached + (usage.cache_creation_input_tokens or 0)
    return SummaryResult(text, finish, total_input, output_tokens, cached, start.model, start.id)
