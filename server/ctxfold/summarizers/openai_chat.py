"""Summaries from any OpenAI-compatible Chat Completions endpoint, through the official SDK.

The request is a cache-safe fork of the agent's own: the same system prompt, tools and
`prompt_cache_key`, the view exactly as the agent sent it up to the last folded message, then the
instruction. The provider's prefix cache therefore serves everything but the instruction."""

from __future__ import annotations

import json
import os
from typing import Any

import openai
import pydantic
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from ctxfold.engine.errors import ConfigError
from ctxfold.summarizers import native
from ctxfold.summarizers.base import (
    ATTEMPT_HOOKS,
    DEFAULT_DEADLINE_SECONDS,
    OnDelta,
    OutputBound,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
    deadline,
    event_data,
    parsed,
)
from ctxfold.summarizers.chat_format import openai_messages

PROVIDER = "openai"
_COMPLETION = pydantic.TypeAdapter(ChatCompletion)
_CHUNK = pydantic.TypeAdapter(ChatCompletionChunk)


class OpenAISummarizer:
    provider = PROVIDER

    def __init__(
        self,
        name: str,
        client: openai.AsyncOpenAI,
        model: str,
        input_window_tokens: int,
        stream: bool = True,
        deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
        compaction: str = "summary",
    ):
        self.name = name
        self.client = client
        self.model = model
        self.server_address = client.base_url.host
        self.server_port = client.base_url.port or (443 if client.base_url.scheme == "https" else 80)
        self.input_window_tokens = input_window_tokens
        self.stream = stream
        self.deadline_seconds = deadline_seconds
        self.compaction = compaction

    @classmethod
    def from_spec(cls, name: str, spec: dict[str, Any]) -> OpenAISummarizer:
        model = spec.get("model")
        if not isinstance(model, str) or not model:
            raise ConfigError(f"summarizers.{name}: model is required")
        key_env = str(spec.get("api_key_env", "OPENAI_API_KEY"))
        client = openai.AsyncOpenAI(
            base_url=spec.get("base_url") or None,
            # Local OpenAI-compatible servers often need no key; the SDK insists on one.
            api_key=os.environ.get(key_env) or "unused",
            timeout=float(spec.get("timeout_seconds", 120)),
            max_retries=int(spec.get("max_retries", 2)),
            http_client=openai.DefaultAsyncHttpxClient(event_hooks=ATTEMPT_HOOKS),
        )
        return cls(
            name,
            client,
            model,
            int(spec.get("input_window_tokens", 128_000)),
            bool(spec.get("stream", True)),
            float(spec.get("deadline_seconds", DEFAULT_DEADLINE_SECONDS)),
            native.mode(name, spec),
        )

    def build_request(self, request: SummaryRequest) -> dict[str, Any]:
        messages = openai_messages(request.prefix)
        messages.append({"role": "user", "content": request.instruction()})
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if request.prompt_cache_key:
            body["prompt_cache_key"] = request.prompt_cache_key
        tools = json.loads(request.tools_json) if request.tools_json else []
        if tools:
            # Same tools as the agent (part of the cached prefix), but the summary must not call them.
            body["tools"] = tools
            body["tool_choice"] = "none"
        if request.send_max_tokens:
            body["max_tokens"] = request.max_tokens
        return body

    async def summarize(self, request: SummaryRequest, on_delta: OnDelta | None = None) -> SummaryResult:
        compact, summary = (lambda: self._compact(request)), (lambda: self._summary(request, on_delta))
        return await native.compacted_or_summary(self.compaction, compact, summary)

    async def _summary(self, request: SummaryRequest, on_delta: OnDelta | None) -> SummaryResult:
        body = self.build_request(request)
        bound = OutputBound(request.max_tokens)
        try:
            async with deadline(self.deadline_seconds):
                result = await (self._streamed(body, bound, on_delta) if self.stream else self._whole(body, bound))
        except openai.OpenAIError as exc:
            raise SummarizerError(f"{type(exc).__name__}: {exc}") from exc
        return result

    async def _compact(self, request: SummaryRequest) -> SummaryResult:
        """The Responses API's compaction of the folded view: its `compaction` item, no text."""
        body: dict[str, Any] = {"model": self.model, "input": native.responses_input(request.prefix)}
        if request.prompt_cache_key:
            body["prompt_cache_key"] = request.prompt_cache_key
        try:
            async with deadline(self.deadline_seconds):
                raw = await self.client.responses.with_raw_response.compact(**body)
        except (openai.BadRequestError, openai.NotFoundError) as exc:
            raise native.unsupported_status(exc.status_code, exc.message) from None
        except openai.OpenAIError as exc:
            raise SummarizerError(f"{type(exc).__name__}: {exc}") from exc
        answer, item = native.compaction_of(raw.http_response.content, "output", PROVIDER)
        if not isinstance(item.get("encrypted_content"), str) or not item["encrypted_content"]:
            raise SummarizerError(f"{PROVIDER}: the compaction item has no encrypted_content")
        usage = answer.get("usage") or {}
        return SummaryResult(
            text="",
            finish_reason="stop",
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cached_input_tokens=int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0),
            response_model=self.model,
            response_id=str(answer.get("id") or ""),
            native=native.payload(native.OPENAI_RESPONSES, item),
        )

    async def _whole(self, body: dict[str, Any], bound: OutputBound) -> SummaryResult:
        """One JSON answer, read only up to the output bound (plus room for its envelope)."""
        async with self.client.chat.completions.with_streaming_response.create(**body) as response:
            data = bytearray()
            async for piece in response.iter_bytes():
                data += piece
                bound.add(len(piece) // 2)  # the envelope (usage, ids, escapes) takes its share
        completion = parsed(_COMPLETION, bytes(data), PROVIDER, "the chat completion")
        if not completion.choices:
            raise SummarizerError(f"{PROVIDER}: the chat completion has no choices")
        choice = completion.choices[0]
        usage = completion.usage
        return SummaryResult(
            text=choice.message.content or "",
            finish_reason=choice.finish_reason or "",
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
            cached_input_tokens=_cached(usage),
            response_model=completion.model,
            response_id=completion.id,
        )

    async def _streamed(self, body: dict[str, Any], bound: OutputBound, on_delta: OnDelta | None) -> SummaryResult:
        parts: list[str] = []
        finish_reason = ""
        input_tokens = output_tokens = cached = 0
        response_model = response_id = ""
        async with self.client.chat.completions.with_streaming_response.create(
            **body, stream=True, stream_options={"include_usage": True}
        ) as answer:
            async for _, data in event_data(answer, PROVIDER):
                if data == "[DONE]":
                    break
                chunk = parsed(_CHUNK, data, PROVIDER, "a chat completion chunk")
                response_model = chunk.model or response_model
                response_id = chunk.id or response_id
                for choice in chunk.choices:
                    if choice.delta.content:
                        bound.add(len(choice.delta.content.encode()))
                        parts.append(choice.delta.content)
                        if on_delta is not None:
                            await on_delta(choice.delta.content)
                    if choice.finish_reason:
                        finish_reason = choice.finish_reason
                if chunk.usage is not None:
                    input_tokens, output_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                    cached = _cached(chunk.usage)
        if not finish_reason:
            # The stream ended cleanly but early (a dropped proxy connection can look like that):
            # what arrived is part of a summary, not a summary.
            raise SummarizerError("the summary stream ended without a finish_reason (incomplete)")
        return SummaryResult(
            "".join(parts), finish_reason, input_tokens, output_tokens, cached, response_model, response_id
        )


def _cached(usage: Any) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    return int(getattr(details, "cached_tokens", 0) or 0)
