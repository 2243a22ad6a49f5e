"""Prompt-cache state from the last activity and the provider's cache TTL. Reported and traced only:
it never triggers a rewrite (a cold cache is a cost, not a reason to change the prefix)."""

from __future__ import annotations

from ctxfold.engine.model import SessionConfig

# Documented provider defaults (seconds): Anthropic's ephemeral cache lives 5 minutes; OpenAI keeps
# cached prefixes 5-10 minutes of inactivity; DeepSeek's disk cache lasts hours.
PROVIDER_TTL_SECONDS = {"anthropic": 300, "openai": 300, "deepseek": 3600}
# A model names its family anywhere in its name ("claude-sonnet-4-5", "openai/gpt-4.1",
# "us.anthropic.claude-…"); the o-series only at the start of a name or a router's path segment.
_MODEL_FAMILIES = (
    ("claude", "anthropic"),
    ("gpt", "openai"),
    ("deepseek", "deepseek"),
)
_O_SERIES = ("o1", "o3", "o4")
# A provider not known by name that reported cache hits (ObserveUsage) caches; its TTL is taken as the
# shortest documented default above rather than left unknown.
OBSERVED_CACHE_TTL_SECONDS = min(PROVIDER_TTL_SECONDS.values())

WARM, COLD, UNKNOWN = "warm", "cold", "unknown"


def provider_of(config: SessionConfig) -> str:
    model = config.model.lower()
    for family, provider in _MODEL_FAMILIES:
        if family in model:
            return provider
    if model.rsplit("/", 1)[-1].startswith(_O_SERIES):
        return "openai"
    return config.summarizer if config.summarizer in PROVIDER_TTL_SECONDS else ""


def cache_ttl_seconds(config: SessionConfig, hits_observed: bool = False) -> int:
    """The session's TTL, else its provider's documented default, else — when the provider reported
    cache hits (`hits_observed`) — the shortest documented default, else 0 (unknown: no TTL set, no
    model named, no cache hit reported)."""
    ttl = config.cache_ttl_seconds or PROVIDER_TTL_SECONDS.get(provider_of(config), 0)
    return ttl or (OBSERVED_CACHE_TTL_SECONDS if hits_observed else 0)


def cache_state(last_activity: float, now: float, ttl_seconds: int) -> str:
    if last_activity <= 0 or ttl_seconds <= 0:
        return UNKNOWN
    return WARM if now - last_activity <= ttl_seconds else COLD
