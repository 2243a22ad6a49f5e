"""Price sheets: US dollars per million tokens for cache-hit input, cache-miss input, cache writes
and output, with the provider whose prompt cache the sheet goes with.

The built-in sheets are the providers' public list prices, as published (month and year in each
`source`). Prices change: pass your own sheet as a JSON file (`--prices my.json`) with the fields of
`PriceSheet`; missing fields take the DeepSeek sheet's values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

PROVIDERS = ("deepseek", "openai", "anthropic")


@dataclass(frozen=True)
class PriceSheet:
    name: str
    provider: str  # whose prompt-cache rules go with these prices: deepseek, openai or anthropic
    input_miss: float  # $ per million input tokens not served from the cache
    input_hit: float  # $ per million input tokens served from the cache
    cache_write: float  # $ per million tokens written to the cache (Anthropic); else = input_miss
    output: float  # $ per million output tokens
    source: str = ""

    def cost(self, hit: int, miss: int, write: int, output: int) -> float:
        """`miss` counts the uncached input tokens that were not written to the cache."""
        return (
            hit * self.input_hit + miss * self.input_miss + write * self.cache_write + output * self.output
        ) / 1_000_000


BUILT_IN: dict[str, PriceSheet] = {
    sheet.name: sheet
    for sheet in (
        # DeepSeek-V3.2 (deepseek-chat / deepseek-reasoner): cache hit $0.028, cache miss $0.28, output $0.42
        # per 1M tokens; api-docs.deepseek.com/quick_start/pricing, as published, September 2025.
        PriceSheet(
            "deepseek-chat",
            "deepseek",
            input_miss=0.28,
            input_hit=0.028,
            cache_write=0.28,
            output=0.42,
            source="DeepSeek API pricing (DeepSeek-V3.2), as published, September 2025",
        ),
        # GPT-5: input $1.25, cached input $0.125, output $10.00 per 1M tokens;
        # openai.com/api/pricing, as published, August 2025.
        PriceSheet(
            "gpt-5",
            "openai",
            input_miss=1.25,
            input_hit=0.125,
            cache_write=1.25,
            output=10.0,
            source="OpenAI API pricing (GPT-5), as published, August 2025",
        ),
        # GPT-4.1: input $2.00, cached input $0.50, output $8.00 per 1M tokens;
        # openai.com/api/pricing, as published, April 2025.
        PriceSheet(
            "gpt-4.1",
            "openai",
            input_miss=2.0,
            input_hit=0.5,
            cache_write=2.0,
            output=8.0,
            source="OpenAI API pricing (GPT-4.1), as published, April 2025",
        ),
        # Claude Sonnet 4.5: base input $3, 5-minute cache write $3.75 (1.25x), cache read $0.30 (0.1x),
        # output $15 per 1M tokens; anthropic.com/pricing, as published, September 2025.
        PriceSheet(
            "claude-sonnet-4.5",
            "anthropic",
            input_miss=3.0,
            input_hit=0.30,
            cache_write=3.75,
            output=15.0,
            source="Anthropic API pricing (Claude Sonnet 4.5, 5-minute cache), as published, September 2025",
        ),
    )
}
DEFAULT_SHEET = "deepseek-chat"


class PriceError(ValueError):
    """A price sheet that cannot be used."""


def sheet_from_mapping(data: Mapping[str, Any], name: str = "custom") -> PriceSheet:
    """A sheet from a JSON object; unknown fields are an error, missing ones come from the default."""
    known = {f.name for f in fields(PriceSheet)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PriceError(
            f"price sheet {name}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    base = BUILT_IN.get(str(data.get("name", "")), BUILT_IN[DEFAULT_SHEET])
    values: dict[str, Any] = {"name": name, "source": f"custom sheet {name}"}
    for key, value in data.items():
        if key in ("name", "provider", "source"):
            values[key] = str(value)
        else:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise PriceError(f"price sheet {name}: {key} must be a number >= 0, got {value!r}")
            values[key] = float(value)
    if "cache_write" not in values and "input_miss" in values:
        values["cache_write"] = values["input_miss"]
    sheet = replace(base, **values)
    if sheet.provider not in PROVIDERS:
        raise PriceError(f"price sheet {name}: provider must be one of {', '.join(PROVIDERS)}, got {sheet.provider!r}")
    return sheet
