"""The three provider APIs the gateway speaks, behind one interface: read the agent's request as
pieces, make a piece canonical, write the view back into the request, read usage and the model's
calls of ctxfold's read tool, and answer errors in the provider's own shape. All pure."""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import orjson
from ctxfold_client import Message, Role, Usage

from ctxfold.gateway.pieces import Json, Piece

ToolFormat = Literal["openai_chat", "openai_responses", "anthropic"]


class BadRequest(ValueError):
    """The agent's request is malformed; answered 400 in the provider's error shape."""


@dataclass(frozen=True)
class Conversation:
    """What the gateway reads from an agent's request."""

    pieces: tuple[Piece, ...]
    model: str
    stream: bool
    max_output_tokens: int
    tools: tuple[Json, ...]
    # Non-empty: why this request is forwarded as it is (its history lives elsewhere, or holds
    # items the gateway cannot place).
    not_reconciled: str = ""


class ViewEntry(NamedTuple):
    """One message of the view with the agent's source of it when the view shows it unchanged (a
    tuple, built in C: a view has hundreds)."""

    message: Message
    source: Json | None


@dataclass(frozen=True)
class CacheHints:
    """What the view says about the provider's prompt cache."""

    key: str  # the session's prompt-cache key
    stable_messages: int  # leading view messages unchanged since the previous view


class Spliced(NamedTuple):
    """Upstream JSON that `resent` splices, and where in it the cache breakpoint of its last turn goes
    (-1: nowhere; only Anthropic's requests carry breakpoints)."""

    json: bytes
    breakpoint_at: int


def split_json(body: dict[str, Any], key: str) -> tuple[bytes, bytes]:
    """`body` as JSON (its `key` array first), cut just before that array's closing bracket."""
    rest = orjson.dumps({k: v for k, v in body.items() if k != key})
    items = orjson.dumps(body[key])
    return b'{"' + key.encode() + b'":' + items[:-1], b"]" + (b"," + rest[1:] if rest != b"{}" else b"}")


@dataclass(frozen=True)
class ReadCall:
    call_id: str
    arguments: str


class ApiFormat(abc.ABC):
    api: str  # the ProviderPayload format
    provider: Literal["openai", "anthropic"]
    tool_format: ToolFormat
    path: str
    # The body's history array when an appended turn is recognized by its bytes (`resent`): the view
    # is written into it, one piece's items after another's. "" = never.
    history_key: str = ""
    # What `resent` inserts where a `Spliced` says a breakpoint goes (b"": the API has none).
    breakpoint: bytes = b""

    @abc.abstractmethod
    def conversation(self, body: dict[str, Any]) -> Conversation: ...

    @abc.abstractmethod
    def canonical(self, piece: Piece) -> Message:
        """The canonical message of a piece, with its provider payload."""

    @abc.abstractmethod
    def rewritten(self, body: dict[str, Any], view: Sequence[ViewEntry], cache: CacheHints) -> dict[str, Any]:
        """`body` with its history replaced by the view; every other field as the agent sent it."""

    @abc.abstractmethod
    def usage(self, response: dict[str, Any]) -> Usage: ...

    @abc.abstractmethod
    def stream_usage(self, event: dict[str, Any], so_far: Usage) -> Usage:
        """The usage known after one stream event (its JSON data)."""

    @abc.abstractmethod
    def read_calls(self, response: dict[str, Any], name: str) -> list[ReadCall]:
        """The calls of tool `name` in a (non-streamed) response."""

    @abc.abstractmethod
    def without_calls(self, response: dict[str, Any], name: str) -> dict[str, Any]:
        """The (non-streamed) response without its calls of tool `name`."""

    @abc.abstractmethod
    def continued(self, body: dict[str, Any], response: dict[str, Any], answers: dict[str, str]) -> dict[str, Any]:
        """`body` followed by the model's turn and the answers to its calls (by call id)."""

    @abc.abstractmethod
    def error(self, status: int, message: str, code: str = "") -> bytes:
        """An error body in the provider's shape."""

    @abc.abstractmethod
    def context_length_error(self, tokens: int, limit: int) -> bytes:
        """The provider's own answer to a prompt longer than the window (status 400)."""

    @abc.abstractmethod
    def refused_as_too_long(self, status: int, payload: bytes) -> bool:
        """Whether an upstream answer is the provider's refusal of a prompt longer than its window."""

    def comparable(self, raw: bytes) -> bytes:
        """A request's bytes as `resent` compares them with the last request's."""
        return raw

    def history_cut(self, body: dict[str, Any]) -> tuple[Spliced, bytes] | None:
        """The upstream `body` cut just before its history closes, for `resent` to insert a resent
        request's new items there (None: it will not)."""
        head, tail = split_json(body, self.history_key)
        return Spliced(head, -1), tail

    def spliced_items(self, middle: bytes, items: list[Json]) -> Spliced:
        """What the upstream gets of a resent request's new `items`: `middle`, their bytes in it."""
        return Spliced(middle, -1)

    def joins(self, last: Role, first: Role) -> bool:
        """Whether a piece of role `first` placed after one of role `last` becomes part of it."""
        return False

    def respelled(self, piece: Piece) -> Piece | None:
        """The piece with its text written the other way the API takes it (a string, or one text
        block), None when there is none: the same message to the model."""
        return None

    def tools_with(self, body: dict[str, Any], definitions: Sequence[Json]) -> dict[str, Any]:
        return {**body, "tools": [*(body.get("tools") or []), *definitions]}


def dumps(value: Json) -> bytes:
    return orjson.dumps(value)


def error_of(payload: bytes) -> dict[str, Any]:
    """The `error` object of an error body in either provider's shape ({} when there is none)."""
    try:
        return as_dict(as_dict(orjson.loads(payload)).get("error"))
    except orjson.JSONDecodeError:
        return {}


def as_list(value: Json) -> list[Json]:
    return value if isinstance(value, list) else []


def as_dict(value: Json) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def count(value: Json) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def text_of(value: Json) -> str:
    return value if isinstance(value, str) else ""


# What a refusal as too long says the prompt came to: OpenAI's "your messages resulted in N tokens" (or "N in the
# messages" when it counts the completion too, as vLLM and LiteLLM do), Anthropic's "prompt is too long: N tokens".
_STATED_TOKENS = re.compile(
    r"resulted in (\d{1,9}) tokens|\((\d{1,9}) in the messages|prompt is too long: (\d{1,9}) tokens"
)


def stated_input_tokens(payload: bytes) -> int:
    """The prompt's tokens as a provider's refusal of it as too long states them (0 when it does not)."""
    match = _STATED_TOKENS.search(text_of(error_of(payload).get("message")))
    return int(next(group for group in match.groups() if group)) if match else 0
