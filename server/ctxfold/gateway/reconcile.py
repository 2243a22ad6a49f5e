"""History reconciliation: agents resend their whole history on every call; the gateway matches it
against the session's transcript by per-message fingerprints. An identical prefix appends the new
suffix; a divergence (an edited or retried message, the agent's own compaction, a message gone)
rewinds the transcript to the last common message and appends the rest, so canonical messages are
never rewritten and the abandoned branch stays readable."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ctxfold_client import Message, Role, ToolCall

from ctxfold.gateway.formats import ApiFormat, BadRequest, Conversation
from ctxfold.gateway.pieces import Json, Piece, fingerprint, request_fingerprints
from ctxfold.gateway.resent import Forwarded

# One append carries at most the server's 1000 messages (docs/operations.md, Limits) and this many
# characters of text, so that even at 4 UTF-8 bytes each it stays under the server's default request
# size (20 MiB); a longer history (an agent that comes to the gateway mid-session, a divergence far
# back) is appended in several.
MAX_APPEND_MESSAGES = 1000
MAX_APPEND_CHARS = 4 << 20
# A call id the agent left empty or repeated in its message (local models send `id: ""`, or one id for every
# call) is made its own in canonical, which takes a call only with one: the agent's id, this, the call's index.
OWN_CALL_ID = "#ctxfold-"


@dataclass(frozen=True)
class Plan:
    """What to do with the transcript: keep its first `keep` messages (rewinding when fewer than it
    holds) and append the request's messages from index `keep` on."""

    keep: int
    rewind: bool


def reconcile(transcript: Sequence[str], request: Sequence[str]) -> Plan:
    """`transcript` and `request` are fingerprints in order."""
    limit = min(len(transcript), len(request))
    if transcript[:limit] == request[:limit]:  # the common case, compared in C
        common = limit
    else:
        common = next(index for index in range(limit) if transcript[index] != request[index])
    return Plan(keep=common, rewind=common < len(transcript))


def message_chars(message: Message) -> int:
    payload = message.provider_payload
    arguments = sum(len(call.arguments) for call in message.tool_calls)
    return len(message.content) + len(message.reasoning_content) + arguments + (len(payload.json) if payload else 0)


def append_batches(messages: Sequence[Message]) -> list[list[Message]]:
    """`messages` in order, cut into appends the server accepts: each within `MAX_APPEND_MESSAGES`
    and `MAX_APPEND_CHARS` (a message larger than that goes alone, for the server to judge)."""
    batches: list[list[Message]] = []
    chars = 0
    for message in messages:
        size = message_chars(message)
        if not batches or len(batches[-1]) >= MAX_APPEND_MESSAGES or chars + size > MAX_APPEND_CHARS:
            batches.append([])
            chars = 0
        batches[-1].append(message)
        chars += size
    return batches


def new_pieces(api: ApiFormat, forwarded: Forwarded, items: list[Json]) -> tuple[Piece, ...] | None:
    """The pieces the inserted items add to the forwarded request's history: None unless the API reads
    them as whole new pieces, and when they open with results of the forwarded request's calls (the full
    path reads the calls they answer, `canonical_messages`)."""
    try:
        added = api.conversation({api.history_key: items})
    except BadRequest:
        return None
    if added.not_reconciled or not added.pieces:
        return None
    first = added.pieces[0].role
    return None if api.joins(forwarded.last_role, first) or first is Role.TOOL else added.pieces


def respelled_as_stored(api: ApiFormat, pieces: Sequence[Piece], request: list[str], stored: list[str]) -> list[str]:
    """`request`'s fingerprints, each that differs from the stored one only in how its text is written (a
    string or one text block: agents that mark their last message for the prompt cache may switch it)
    taken as the stored one: the same message to the model, not an edit to rewind. (Fingerprints stay of
    the spelling sent: one spelling for all would change those of every stored message.)"""
    limit = min(len(request), len(stored))
    if request[:limit] == stored[:limit]:  # the common case, compared in C
        return request
    out = list(request)
    for index in range(limit):
        if out[index] != stored[index]:
            other = api.respelled(pieces[index])
            if other is None or fingerprint(api.api, other) != stored[index]:
                break  # an edit: reconciliation rewinds here
            out[index] = stored[index]
    return out


def reconciled_request(
    api: ApiFormat, conversation: Conversation, fingerprints: list[str], known_json: bytes
) -> tuple[list[str], bytes, Plan, list[list[Message]]]:
    """The request's fingerprints and their JSON (`request_fingerprints`, `respelled_as_stored`), how it
    continues a transcript of `fingerprints`, and the canonical messages it appends, in `append_batches`."""
    request, request_json = request_fingerprints(api.api, conversation.pieces, fingerprints, known_json)
    request = respelled_as_stored(api, conversation.pieces, request, fingerprints)
    plan = reconcile(fingerprints, request)
    return request, request_json, plan, append_batches(canonical_messages(api, conversation.pieces, plan.keep))


def canonical_messages(api: ApiFormat, pieces: Sequence[Piece], start: int) -> list[Message]:
    """The canonical messages of `pieces[start:]`, their call ids made their own (`with_own_call_ids`), read
    from the assistant turn whose results they may continue."""
    first = start
    while first > 0 and pieces[first - 1].role is Role.TOOL:
        first -= 1
    if first > 0 and pieces[first - 1].role is Role.ASSISTANT:
        first -= 1
    return with_own_call_ids([api.canonical(piece) for piece in pieces[first:]])[start - first :]


def with_own_call_ids(messages: Sequence[Message]) -> list[Message]:
    """`messages` with each call id the agent left empty or repeated in its message made its own (`OWN_CALL_ID`),
    and each result naming the call it answers: the first still waiting of the id it gives. (The view shows the
    agent's JSON; a message rendered from its fields gets the agent's ids back, `with_agent_call_ids`.)"""
    out: list[Message] = []
    waiting: list[tuple[str, str]] = []  # the last assistant message's unanswered calls: (the agent's id, its own)
    for message in messages:
        if message.role is Role.TOOL:
            given = message.tool_call_id
            match = next((n for n, (agent_id, _) in enumerate(waiting) if agent_id == given), None)
            own = waiting.pop(match)[1] if match is not None else given
            out.append(message if own == given else replace(message, tool_call_id=own))
            continue
        calls = own_calls(message.tool_calls)
        waiting = [(given.id, own.id) for given, own in zip(message.tool_calls, calls, strict=True)]
        out.append(message if calls == message.tool_calls else replace(message, tool_calls=calls))
    return out


def own_calls(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """Each call, with an id of its own when the agent's is empty or came before in `calls`."""
    own: list[ToolCall] = []
    for index, call in enumerate(calls):
        taken = not call.id or any(call.id == other.id for other in own)
        own.append(replace(call, id=f"{call.id}{OWN_CALL_ID}{index}") if taken else call)
    return tuple(own)


def with_agent_call_ids(message: Message) -> Message:
    """`message` with the call ids the agent gave, where `with_own_call_ids` made them its own."""
    if OWN_CALL_ID not in message.tool_call_id and not any(OWN_CALL_ID in call.id for call in message.tool_calls):
        return message
    calls = tuple(replace(call, id=agent_call_id(call.id)) for call in message.tool_calls)
    return replace(message, tool_call_id=agent_call_id(message.tool_call_id), tool_calls=calls)


def agent_call_id(call_id: str) -> str:
    head, made_own, _ = call_id.rpartition(OWN_CALL_ID)
    return head if made_own else call_id
