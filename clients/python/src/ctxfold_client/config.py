"""`SessionConfig`: the typed builder of `ctxfold.v1.SessionConfig`.

Every field defaults to "unset" (the zero value), which the server replaces by its default, so a
config names only what it changes. The same type serves as the overrides of `fork()`, where unset
fields keep the source's. A value outside its documented range is refused here, as the server would
(CtxfoldError INVALID_CONFIG, domain "client.ctxfold.dev", metadata `field`); checks that need the
whole config (does max_output_tokens fit below the trigger?) stay the server's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from ctxfold_client import _json
from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client._gen.enums import ErrorReason
from ctxfold_client.errors import CtxfoldError

Tools = str | Sequence[Mapping[str, Any]]


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionConfig:
    """Per-session settings; see the fields of `ctxfold.v1.SessionConfig`.

    `tools` takes the provider tool schemas as a list of JSON objects (or a JSON array string);
    they are counted in every estimate and sent with summaries. They are sent as the one JSON form
    all ctxfold SDKs write (compact, keys in their order, non-ASCII as is), so the same tools cost
    the same tokens whichever SDK created the session.

    Server defaults of unset fields: `context_window` is required; `compact_ratio` 0.80 (fold when
    the view reaches 80 % of the window), `tail_ratio` 0.08, `summary_max_tokens` 8192 (less for small windows),
    `tool_content_max_bytes` 32768 (larger tool results are bounded in the view and kept whole for
    `read_tool_result()`), `summarizer` "extractive", `prompt_cache_key` derived from the session.
    `prefold_ratio` is the one field whose zero is a value: `None` (unset) is the server's default
    (compact_ratio - 0.05 for a summarizer that calls a model, off for "extractive"), `0.0` turns
    background folds off, and a ratio in [0.10, compact_ratio) starts them there.

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
    prefold_ratio: float | None = None

    def __post_init__(self) -> None:
        _check_ranges(self)

    def replace(self, **changes: Any) -> SessionConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @property
    def tools_json(self) -> str:
        """The tools as sent: JSON text normalized, a list written, both in the one form."""
        if not isinstance(self.tools, str):
            return _json.dumps(list(self.tools))
        if not self.tools:
            return ""
        try:
            return _json.normalized(self.tools)
        except ValueError as exc:
            raise _invalid("tools_json", f"is not JSON ({exc})") from None

    def to_proto(self) -> pb.SessionConfig:
        config = pb.SessionConfig(
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
        if self.prefold_ratio is not None:
            config.prefold_ratio = self.prefold_ratio
        return config

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
            prefold_ratio=config.prefold_ratio if config.HasField("prefold_ratio") else None,
        )

    def check_creatable(self) -> None:
        """The check of `create_session`: a new session needs its context window."""
        if self.context_window <= 0:
            raise _invalid("context_window", "is required and must be > 0")

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> SessionConfig:
        """A config from its proto JSON form (`{"context_window": 16000, "tools_json": "[...]"}`)."""
        return cls.from_proto(json_format.ParseDict(dict(value), pb.SessionConfig()))


def _invalid(field: str, why: str) -> CtxfoldError:
    return CtxfoldError.invalid_argument(ErrorReason.INVALID_CONFIG, field, f"config.{field}: {why}")


def _check_ranges(config: SessionConfig) -> None:
    """The documented ranges of the fields that are set (0 = unset, the server's default)."""
    if config.context_window < 0:
        raise _invalid("context_window", f"must be > 0, got {config.context_window}")
    if config.compact_ratio and not 0.30 <= config.compact_ratio <= 0.95:
        raise _invalid("compact_ratio", f"must be within [0.30, 0.95], got {config.compact_ratio}")
    if config.tail_ratio and not 0.0 < config.tail_ratio <= 0.5:
        raise _invalid("tail_ratio", f"must be within (0, 0.5], got {config.tail_ratio}")
    for name in ("max_output_tokens", "summary_max_tokens", "cache_ttl_seconds"):
        if getattr(config, name) < 0:
            raise _invalid(name, f"must be >= 0, got {getattr(config, name)}")
    prefold = config.prefold_ratio
    if prefold is not None and prefold != 0.0 and not 0.10 <= prefold < 1.0:
        raise _invalid("prefold_ratio", f"must be 0 (off) or within [0.10, compact_ratio), got {prefold}")
    size = config.tool_content_max_bytes
    if size and not 4096 <= size <= 1_048_576:
        raise _invalid("tool_content_max_bytes", f"must be within [4096, 1048576], got {size}")
