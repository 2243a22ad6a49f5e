"""`SessionConfig`: the typed builder of `ctxfold.v1.SessionConfig`.

Every field defaults to "unset" (the zero value), which the server replaces by its default, so a
config names only what it changes. The server validates the values (INVALID_CONFIG); the SDK only
converts. The same type serves as the overrides of `fork()`, where unset fields keep the source's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from ctxfold_client._gen import context_service_pb2 as pb

Tools = str | Sequence[Mapping[str, Any]]


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionConfig:
    """Per-session settings; see the fields of `ctxfold.v1.SessionConfig`.

    `tools` takes the provider tool schemas as a list of JSON objects (or a JSON array string);
    they are counted in every estimate and sent with summaries.

    Server defaults of unset fields: `context_window` is required; `compact_ratio` 0.80 (fold when
    the view reaches 80 % of the window), `tail_ratio` 0.16, `summary_max_tokens` 8192 (less for small windows),
    `tool_content_max_bytes` 32768 (larger tool results are bounded in the view and kept whole for
    `read_tool_result()`), `summarizer` "extractive", `prompt_cache_key` derived from the session.

    >>> SessionConfig(context_window=128_000, max_output_tokens=4096, system_prompt="You are terse.")
    """

    context_window: int = 0
    compact_ratio: float = 0.0
    tail_ratio: float = 0.0
    max_output_tokens: int = 0
    summary_max_tokens: int = 0
    tool_content_max_bytes: int = 0
    system_prompt: str = ""
    tools: Tools = ""
    summarizer: str = ""
    cache_ttl_seconds: int = 0
    prompt_cache_key: str = ""
    model: str = ""
    disable_task_anchor: bool = False

    def replace(self, **changes: Any) -> SessionConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @property
    def tools_json(self) -> str:
        if isinstance(self.tools, str):
            return self.tools
        return json.dumps(list(self.tools), ensure_ascii=False, separators=(",", ":"))

    def to_proto(self) -> pb.SessionConfig:
        return pb.SessionConfig(
            context_window=self.context_window,
            compact_ratio=self.compact_ratio,
            tail_ratio=self.tail_ratio,
            max_output_tokens=self.max_output_tokens,
            summary_max_tokens=self.summary_max_tokens,
            tool_content_max_bytes=self.tool_content_max_bytes,
            system_prompt=self.system_prompt,
            tools_json=self.tools_json,
            summarizer=self.summarizer,
            cache_ttl_seconds=self.cache_ttl_seconds,
            prompt_cache_key=self.prompt_cache_key,
            model=self.model,
            disable_task_anchor=self.disable_task_anchor,
        )

    @classmethod
    def from_proto(cls, config: pb.SessionConfig) -> SessionConfig:
        """The config of a session as the server reports it (defaults filled in)."""
        return cls(
            context_window=config.context_window,
            compact_ratio=config.compact_ratio,
            tail_ratio=config.tail_ratio,
            max_output_tokens=config.max_output_tokens,
            summary_max_tokens=config.summary_max_tokens,
            tool_content_max_bytes=config.tool_content_max_bytes,
            system_prompt=config.system_prompt,
            tools=config.tools_json,
            summarizer=config.summarizer,
            cache_ttl_seconds=config.cache_ttl_seconds,
            prompt_cache_key=config.prompt_cache_key,
            model=config.model,
            disable_task_anchor=config.disable_task_anchor,
        )

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> SessionConfig:
        """A config from its proto JSON form (`{"context_window": 16000, "tools_json": "[...]"}`)."""
        return cls.from_proto(json_format.ParseDict(dict(value), pb.SessionConfig()))
