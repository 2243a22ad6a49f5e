"""Summaries from Anthropic's Messages API, through the official SDK.

A cache breakpoint sits on the last block of the replayed prefix, so the fold request reads the
prefix the agent's own requests cached (cache reads match at earlier block boundaries too)."""

from __future__ import annotations

import json
import os
from typing import Any

import anthropic

from ctxfold.engine.errors import ConfigError
from ctxfold.summarizers.base import (
    DEFAULT_DEADLINE_SECONDS,
    OnDelta,
    OutputBound,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
    deadline,
)
from ctxfold.summarizers.chat_format import anthropic_messages

_EPHEMERAL = {"type": "ephemeral"}


class AnthropicSummarizer:
    provider = "anthropic"

    def __init__(
        self,
        name: str,
        client: anthropic.AsyncAnthropic,
        model: str,
        input_window_tokens: int,
        deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
    ):
        self.name = name
        self.client = client
        self.model = model
        self.server_address = client.base_url.host
        self.input_window_tokens = input_window_tokens
        self.deadline_seconds = deadline_seconds

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
        )
        return cls(
            name,
            client,
            model,
            int(spec.get("input_window_tokens", 200_000)),
            float(spec.get("deadline_seconds", DEFAULT_DEADLINE_SECONDS)),
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
        bound = OutputBound(request.max_tokens)
        try:
            async with (
                deadline(self.deadline_seconds),
                self.client.messages.stream(**self.build_request(request)) as stream,
            ):
                async for text in stream.text_stream:
                    bound.add(len(text.encode()))
                    if on_delta is not None:
                        await on_delta(text)
                final = await stream.get_final_message()
        except anthropic.AnthropicError as exc:
            raise SummarizerError(f"{type(exc).__name__}: {exc}") from exc
        if final.stop_reason is None:
            # The stream ended before message_delta / message_stop: part of a summary, not a summary.
            raise SummarizerError("the summary stream ended without a stop_reason (incomplete)")
        text = "".join(block.text for block in final.content if block.type == "text")
        finish = "length" if final.stop_reason == "max_tokens" else "stop"
        usage = final.usage
        cached = usage.cache_read_input_tokens or 0
        # Anthropic reports uncached input apart from cache reads and writes; report the total read.
        total_input = usage.input_tokens + cached + (usage.cache_creation_input_tokens or 0)
        return SummaryResult(text, finish, total_input, usage.output_tokens, cached, final.model)
