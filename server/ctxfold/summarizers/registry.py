"""Builds the server's summarizers from the `summarizers` setting (JSON: name -> spec)."""

from __future__ import annotations

import json
from typing import Any

from ctxfold.engine.errors import ConfigError
from ctxfold.summarizers.base import Summarizer
from ctxfold.summarizers.extractive import ExtractiveSummarizer


def _int(spec: dict[str, Any], key: str, default: int) -> int:
    value = spec.get(key, default)
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"summarizers: {key} must be a positive integer")
    return value


def build_summarizers(setting: str) -> dict[str, Summarizer]:
    summarizers: dict[str, Summarizer] = {"extractive": ExtractiveSummarizer()}
    try:
        specs = json.loads(setting) if setting else {}
    except ValueError as exc:
        raise ConfigError(f"summarizers: not valid JSON ({exc})") from None
    if not isinstance(specs, dict):
        raise ConfigError("summarizers: must be an object mapping names to specs")
    for name, spec in specs.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"summarizers.{name}: must be an object")
        kind = spec.get("type", name)
        if kind == "extractive":
            summarizers[name] = ExtractiveSummarizer(_int(spec, "input_window_tokens", 1_000_000))
        elif kind == "openai":
            from ctxfold.summarizers.openai_chat import OpenAISummarizer

            summarizers[name] = OpenAISummarizer.from_spec(name, spec)
        elif kind == "anthropic":
            from ctxfold.summarizers.anthropic_messages import AnthropicSummarizer

            summarizers[name] = AnthropicSummarizer.from_spec(name, spec)
        else:
            raise ConfigError(f"summarizers.{name}: unknown type {kind!r} (extractive, openai, anthropic)")
    return summarizers
