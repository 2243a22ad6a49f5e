"""Prompt-cache state from the last activity and the provider's cache TTL. Reported and traced only:
it never triggers a rewrite (a cold cache is a cost, not a reason to change the prefix)."""

from __future__ import annotations

from ctxfold.engine.model import SessionConfig

# Documented provider defaults (seconds): Anthropic's ephemeral cache lives 5 minutes; OpenAI keeps
# cached prefixes 5-10 minutes of inactivity; DeepSeek's disk cache lasts hours.
PROVIDER_TTL_SECONDS = {"anthropic": 300, "openai": 300, "deepseek": 3600}
_MODEL_PREFIXES = (
    ("claude", "anthropic"),
    ("gpt", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("o4", "openai"),
    ("deepseek", "deepseek"),
)

WARM, COLD, UNKNOWN = "warm", "cold", "unknown"


def provider_of(config: SessionConfig) -> str:
    model = config.model.lower()
    for prefix, provider in _MODEL_PREFIXES:
        if model.startswith(prefix):
            return provider
    return config.summarizer if config.summarizer in PROVIDER_TTL_SECONDS else ""


def cache_ttl_seconds(config: SessionConfig) -> int:
    """The session's TTL, else its provider's default, else 0 (unknown)."""
    return config.cache_ttl_seconds or PROVIDER_TTL_SECONDS.get(provider_of(config), 0)


def cache_state(last_activity: float, now: float, ttl_seconds: int) -> str:
    if last_activity <= 0 or ttl_seconds <= 0:
        return UNKNOWN
    return WARM if now - last_activity <= ttl_seconds else COLD
