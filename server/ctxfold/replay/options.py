"""What a replay is given — its options, and the trace and price sheet it reads from files — and
`ReplayError`, why a replay could not go on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ctxfold.engine.model import DEFAULT_COMPACT_RATIO, DEFAULT_TAIL_RATIO
from ctxfold.replay.prices import BUILT_IN, DEFAULT_SHEET, PriceError, PriceSheet, sheet_from_mapping
from ctxfold.replay.simulator import Provider, cache_model
from ctxfold.replay.trace import Trace, parse_trace
from ctxfold.v1 import context_service_pb2 as pb


class ReplayError(Exception):
    """The replay could not go on; the message says why."""


@dataclass(frozen=True)
class Options:
    window: int = 32000
    ratio: float = 0.0  # 0 = the server's default (DEFAULT_COMPACT_RATIO)
    tail_ratio: float = 0.0
    max_output_tokens: int = 0
    summary_max_tokens: int = 0
    summarizer: str = ""
    prices: PriceSheet = BUILT_IN[DEFAULT_SHEET]
    provider_cache: str = ""  # "" = the price sheet's provider
    cache_ttl: float | Literal["default"] | None = "default"
    think_seconds: float = 10.0
    prefold_ratio: float | None = None  # None = the server's default for the summarizer

    def settings(self) -> dict[str, object]:
        return {
            "window": self.window,
            "ratio": self.ratio or DEFAULT_COMPACT_RATIO,
            "tail_ratio": self.tail_ratio or DEFAULT_TAIL_RATIO,
            "max_output_tokens": self.max_output_tokens,
            "summarizer": self.summarizer or "extractive",
            "think_seconds": self.think_seconds,
            **({} if self.prefold_ratio is None else {"prefold_ratio": self.prefold_ratio}),
        }

    def config(self, trace: Trace) -> pb.SessionConfig:
        """The session config a replay of `trace` creates."""
        config = pb.SessionConfig(
            context_window=self.window,
            compact_ratio=self.ratio,
            tail_ratio=self.tail_ratio,
            max_output_tokens=self.max_output_tokens,
            summary_max_tokens=self.summary_max_tokens,
            system_prompt=trace.system_prompt,
            tools_json=trace.tools_json,
            summarizer=self.summarizer,
        )
        if self.prefold_ratio is not None:
            config.prefold_ratio = self.prefold_ratio
        return config

    def provider(self) -> Provider:
        return Provider(cache_model(self.provider_cache or self.prices.provider, self.cache_ttl), self.prices)


def load_trace_file(path: str | Path) -> Trace:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_trace(p.name, text)


def load_prices(name_or_path: str) -> PriceSheet:
    """A built-in sheet by name, or a JSON file of `PriceSheet` fields."""
    if name_or_path in BUILT_IN:
        return BUILT_IN[name_or_path]
    path = Path(name_or_path)
    if not path.exists():
        raise PriceError(f"unknown price sheet {name_or_path!r}: not a built-in ({', '.join(BUILT_IN)}) nor a file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PriceError(f"price sheet {name_or_path}: {exc}") from None
    if not isinstance(data, dict):
        raise PriceError(f"price sheet {name_or_path}: expected a JSON object")
    return sheet_from_mapping(data, str(data.get("name") or path.stem))
