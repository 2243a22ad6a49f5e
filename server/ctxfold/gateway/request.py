"""The agent's request: who sent it and how it came (`Caller`, `Incoming`), read (`parsed`, `Read`), and
written for the upstream with the view in place of its history (`rewritten_upstream`). Pure but for
the aiohttp request it carries."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson
from aiohttp import web
from ctxfold_client import Role

from ctxfold.gateway.contexts import Bucket, Prepared, view_entries
from ctxfold.gateway.formats import ApiFormat, BadRequest, CacheHints, Conversation, Spliced
from ctxfold.gateway.pieces import loads
from ctxfold.gateway.read_rounds import offers_read_tool, with_read_tool
from ctxfold.gateway.resent import BUCKET_BYTES, Forwarded, history_close

SESSION_HEADER = "x-ctxfold-session"


@dataclass(frozen=True)
class Caller:
    api_key: str  # the agent's provider key: forwarded, hashed into session keys, never stored
    token: str  # the ctxfold bearer token of its tenant ("" = the gateway's single tenant)


@dataclass(frozen=True)
class Incoming:
    """An agent's request to one of the three APIs, as it came."""

    api: ApiFormat
    request: web.Request
    raw: bytes
    comparable: bytes  # `raw` as `resent` compares it (`ApiFormat.comparable`)
    caller: Caller
    bucket: Bucket | None  # where its continuation will be looked for (None: never recognized by bytes)
    window: int


@dataclass(frozen=True)
class Read:
    """The request as read: what the gateway reads from it, and its JSON and `work_size` once parsed
    whole (a resent request recognized by its bytes is not, until its Prepare says it must be)."""

    conversation: Conversation
    body: dict[str, Any] | None = None
    work: int = 0


def parsed(api: ApiFormat, raw: bytes) -> tuple[dict[str, Any], Conversation]:
    """The agent's request and what the gateway reads from it (orjson.JSONDecodeError, BadRequest)."""
    body = loads(raw)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body, api.conversation(body)


def upstream_request(
    api: ApiFormat, body: dict[str, Any], conversation: Conversation, prepared: Prepared, offers_read: bool
) -> dict[str, Any]:
    """The agent's request with the view for its history (and the read tool when offered)."""
    cache = CacheHints(prepared.view.prompt_cache_key, prepared.view.stable_prefix_messages)
    rewritten = api.rewritten(body, view_entries(prepared.view, conversation, api.api), cache)
    return with_read_tool(api, rewritten) if offers_read else rewritten


def forwarded(
    incoming: Incoming, body: dict[str, Any], conversation: Conversation, upstream: tuple[Spliced, bytes],
    prepared: Prepared, offers_read: bool,
) -> Forwarded | None:  # fmt: skip
    """The request as `resent` recognizes its continuation: when its history is found in its bytes,
    and its session key stays the same as messages are appended (without the header, the key is
    derived from the first user message: one must be there)."""
    close = history_close(incoming.comparable, body, incoming.api.history_key)
    if close is None or close < BUCKET_BYTES or not conversation.pieces or not prepared.view.messages:
        return None
    keyed = incoming.request.headers.get(SESSION_HEADER) or any(p.role is Role.USER for p in conversation.pieces)
    if not keyed:
        return None
    return Forwarded(
        head=incoming.comparable[:close],
        tail=incoming.comparable[close:],
        upstream_head=upstream[0],
        upstream_tail=upstream[1],
        conversation=replace(conversation, pieces=()),
        last_role=conversation.pieces[-1].role,
        view=prepared.view,
        offers_read=offers_read,
    )


def rewritten_upstream(
    incoming: Incoming, body: dict[str, Any], conversation: Conversation, prepared: Prepared, read_rounds: bool
) -> tuple[bytes, bool, Forwarded | None]:
    """The upstream body with the whole view, whether it offers the read tool (when `read_rounds` are
    allowed), and the request as `resent` will recognize its continuation (None: it will not)."""
    api = incoming.api
    offers_read = read_rounds and offers_read_tool(prepared, conversation, api)
    rewritten = upstream_request(api, body, conversation, prepared, offers_read)
    cut = api.history_cut(rewritten) if api.history_key and incoming.bucket is not None else None
    if cut is None:
        return orjson.dumps(rewritten), offers_read, None
    kept = forwarded(incoming, body, conversation, cut, prepared, offers_read)
    # Where the API places breakpoints, the body this request sends has them all (`rewritten`).
    (head, _), tail = cut
    return head + tail if not api.breakpoint else orjson.dumps(rewritten), offers_read, kept
