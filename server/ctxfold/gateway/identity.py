"""Which session a request belongs to, and the window of a new one.

A request names its session with the `x-ctxfold-session` header; without it the key is derived
from what stays the same for the whole of one conversation and differs between two: the provider
API, the model family (the model name without a trailing date), the system prompt and the first
user message. Either way the key is prefixed with a digest of the agent's API key, so two API keys
never share a session, and the server scopes keys by tenant."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

from ctxfold_client import Role

from ctxfold.gateway.formats import ApiFormat
from ctxfold.gateway.pieces import Piece, stable_json

# Context windows of current models by name prefix (the longest matching prefix wins): the input a
# request may carry. A model that matches none gets DEFAULT_WINDOW. Overridden by the gateway's
# `context_windows` setting and, for the request that creates the session, by the
# `x-ctxfold-context-window` header. GPT-5 models take 272k input tokens of their 400k (the rest is
# their output, whether or not the request caps it; Codex CLI's window too): a window of 400k would
# put the trigger above what OpenAI accepts, and the agent would get context_length_exceeded before
# any fold.
MODEL_WINDOWS: Mapping[str, int] = {
    "claude": 200_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4-turbo": 128_000,
    "gpt-5": 272_000,
    "gpt-5-chat": 128_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "deepseek": 128_000,
    "gemini": 1_048_576,
    "grok-4": 256_000,
    "qwen3": 262_144,
}
DEFAULT_WINDOW = 128_000
# Anthropic's beta header that gives a Claude model a 1M-token window (Claude Code's `sonnet[1m]`).
ANTHROPIC_1M_BETA = "context-1m-"
ANTHROPIC_1M_WINDOW = 1_000_000
_DATE_SUFFIX = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2}|latest)$")


def model_family(model: str) -> str:
    return _DATE_SUFFIX.sub("", model)


def context_window(model: str, overrides: Mapping[str, int], anthropic_beta: str = "") -> int:
    """The window of `model`: the gateway's settings', else Anthropic's 1M window when the request asks
    for it (`anthropic-beta: context-1m-…`), else the table's."""
    matches = [prefix for prefix in overrides if model.startswith(prefix)]
    if matches:
        return overrides[max(matches, key=len)]
    if model.startswith("claude") and ANTHROPIC_1M_BETA in anthropic_beta:
        return ANTHROPIC_1M_WINDOW
    matches = [prefix for prefix in MODEL_WINDOWS if model.startswith(prefix)]
    return MODEL_WINDOWS[max(matches, key=len)] if matches else DEFAULT_WINDOW


def api_key_of(headers: Mapping[str, str]) -> str:
    """The agent's API key: OpenAI's bearer token or Anthropic's x-api-key."""
    authorization = headers.get("Authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return headers.get("x-api-key", "")


def api_key_digest(api_key: str) -> str:
    """What the gateway keeps of an API key: 16 hex digits of its SHA-256 (never the key)."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


def session_key(api: ApiFormat, api_key: str, header_key: str, model: str, pieces: Sequence[Piece]) -> str:
    """The key of the request's session: the header's, or one derived from the conversation's opening."""
    if header_key:
        return f"{api_key_digest(api_key)}:{header_key}"
    digest = hashlib.sha256(f"{api.api}\x00{model_family(model)}\x00".encode())
    system = next((p for p in pieces[:1] if p.role is Role.SYSTEM), None)
    first_user = next((p for p in pieces if p.role is Role.USER), None)
    for piece in (system, first_user):
        digest.update(b"\x00" + (plainly_spelled(api, piece) if piece is not None else b""))
    return f"{api_key_digest(api_key)}:derived:{digest.hexdigest()[:32]}"


def plainly_spelled(api: ApiFormat, piece: Piece) -> bytes:
    """The piece's JSON, of its text written the plainer way the API takes it when there are two (a string
    rather than one text block: `ApiFormat.respelled`): layers that mark the last message for the prompt cache
    write the first one as a block until another follows, and a Responses `input` string comes back an item."""
    own = stable_json(piece.source)
    other = api.respelled(piece)
    plainer = stable_json(other.source) if other is not None else own
    return plainer if len(plainer) <= len(own) else own
