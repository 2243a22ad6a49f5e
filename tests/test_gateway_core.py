"""The gateway's pure decisions, directly: reconciliation, session keys and windows, fingerprints and
payloads, attachments and their token formulas, cache breakpoints, SSE events, usage reporting."""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from ctxfold_client import Action, Message, ProviderPayload, Role, ToolCall

from ctxfold.gateway import sse
from ctxfold.gateway.attachments import anthropic_image_tokens, image_size, openai_image_tokens
from ctxfold.gateway.contexts import OBSERVE_INTERVAL_SECONDS, native_summary, should_observe
from ctxfold.gateway.formats import ApiFormat, CacheHints, ViewEntry
from ctxfold.gateway.formats.anthropic_cache import place_breakpoints
from ctxfold.gateway.formats.anthropic_messages import AnthropicMessages
from ctxfold.gateway.formats.openai_chat import OpenAIChat
from ctxfold.gateway.formats.openai_responses import OpenAIResponses
from ctxfold.gateway.identity import DEFAULT_WINDOW, context_window, model_family, session_key
from ctxfold.gateway.pieces import Piece, fingerprint, request_fingerprints, respelled_text
from ctxfold.gateway.reconcile import (
    MAX_APPEND_CHARS,
    MAX_APPEND_MESSAGES,
    Plan,
    append_batches,
    reconcile,
    respelled_as_stored,
)
from ctxfold.gateway.sse import EventSplitter

# ---- reconciliation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("transcript", "request_", "plan"),
    [
        ([], ["a", "b"], Plan(keep=0, rewind=False)),  # a new session: append everything
        (["a", "b"], ["a", "b", "c", "d"], Plan(keep=2, rewind=False)),  # the common case: the new suffix
        (["a", "b"], ["a", "b"], Plan(keep=2, rewind=False)),  # the same request again
        (["a", "b", "c"], ["a", "x", "c", "d"], Plan(keep=1, rewind=True)),  # an edit: rewind to the last common
        (["a", "b", "c"], ["a", "b"], Plan(keep=2, rewind=True)),  # a retry: the answer is dropped
        (["a", "b", "c"], ["z"], Plan(keep=0, rewind=True)),  # another conversation under the same key
    ],
)
def test_reconcile(transcript: list[str], request_: list[str], plan: Plan) -> None:
    assert reconcile(transcript, request_) == plan


def test_text_respelled_is_the_same_message_not_an_edit() -> None:
    """An agent that writes its last message as one marked text block for the prompt cache, and as a string
    once it is no longer last: the stored message matches either spelling; an edit is still an edit."""
    assert respelled_text("hi", "text") == [{"type": "text", "text": "hi"}]
    assert respelled_text([{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}], "text") == "hi"
    assert respelled_text([{"type": "text", "text": "hi"}, {"type": "text", "text": "!"}], "text") is None
    assert respelled_text([{"type": "image", "text": "hi"}], "text") is None
    chat = OpenAIChat()
    marked = [{"type": "text", "text": "and b.py", "cache_control": {"type": "ephemeral"}}]
    sent = [{"role": "user", "content": "Fix a.py"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": marked}]  # fmt: skip
    stored = [fingerprint(chat.api, Piece(Role.USER if m["role"] == "user" else Role.ASSISTANT, m)) for m in sent]
    resent = [*sent[:2], {"role": "user", "content": "and b.py"}, {"role": "assistant", "content": "done"}]
    pieces = [Piece(Role.USER if m["role"] == "user" else Role.ASSISTANT, m) for m in resent]
    request = [fingerprint(chat.api, p) for p in pieces]
    assert request[2] != stored[2]
    matched = respelled_as_stored(chat, pieces, request, stored)
    assert matched == [*stored, request[3]] and reconcile(stored, matched) == Plan(keep=3, rewind=False)
    edited = [*pieces[:2], Piece(Role.USER, {"role": "user", "content": "and c.py"}), pieces[3]]
    request = [fingerprint(chat.api, p) for p in edited]
    assert reconcile(stored, respelled_as_stored(chat, edited, request, stored)) == Plan(keep=2, rewind=True)
    anthropic = AnthropicMessages()
    assert anthropic.respelled(Piece(Role.USER, "hi")) == Piece(Role.USER, [{"type": "text", "text": "hi"}])
    assert anthropic.respelled(Piece(Role.TOOL, [{"type": "tool_result", "tool_use_id": "t", "content": "x"}])) is None


# ---- identity -------------------------------------------------------------------------------------


def test_a_long_history_is_appended_in_batches_the_server_accepts() -> None:
    short = [Message(role=Role.USER, content=f"m{n}") for n in range(2 * MAX_APPEND_MESSAGES + 5)]
    assert [len(b) for b in append_batches(short)] == [MAX_APPEND_MESSAGES, MAX_APPEND_MESSAGES, 5]
    assert [m for b in append_batches(short) for m in b] == short
    third = MAX_APPEND_CHARS // 3
    results = [Message(role=Role.TOOL, content="x" * third, tool_call_id=f"c{n}") for n in range(4)]
    assert [len(b) for b in append_batches(results)] == [3, 1]  # by characters
    calls = Message(role=Role.ASSISTANT, tool_calls=(ToolCall("c", "bash", "y" * third),))
    payload = Message(role=Role.USER, content="z", provider_payload=ProviderPayload("openai_chat", "w" * third))
    assert [len(b) for b in append_batches([results[0], calls, payload, results[1]])] == [3, 1]
    huge = Message(role=Role.TOOL, content="x" * (MAX_APPEND_CHARS + 1), tool_call_id="h")
    assert append_batches([short[0], huge, short[1]]) == [[short[0]], [huge], [short[1]]]  # alone
    assert append_batches([]) == []


def test_a_header_key_is_scoped_by_the_api_key() -> None:
    pieces = (Piece(Role.USER, "hi"),)
    one = session_key(OpenAIChat(), "sk-a", "my-task", "gpt-4.1", pieces)
    assert one.endswith(":my-task")
    assert one != session_key(OpenAIChat(), "sk-b", "my-task", "gpt-4.1", pieces)
    assert "sk-a" not in one


def test_a_derived_key_follows_the_opening_not_the_rest() -> None:
    system, task = Piece(Role.SYSTEM, "Be brief."), Piece(Role.USER, "Fix a.py")
    base = session_key(OpenAIChat(), "sk", "", "gpt-4.1-2025-04-14", (system, task))
    later = (system, task, Piece(Role.ASSISTANT, {"role": "assistant", "content": "ok"}), Piece(Role.USER, "more"))
    assert session_key(OpenAIChat(), "sk", "", "gpt-4.1", later) == base  # same family, same opening
    assert session_key(OpenAIChat(), "sk", "", "gpt-4.1", (system, Piece(Role.USER, "Fix b.py"))) != base
    assert session_key(OpenAIChat(), "sk", "", "gpt-4.1", (Piece(Role.SYSTEM, "Other."), task)) != base
    assert session_key(AnthropicMessages(), "sk", "", "gpt-4.1", (system, task)) != base
    assert session_key(OpenAIChat(), "sk", "", "gpt-5", (system, task)) != base


def test_the_opening_read_however_its_text_is_spelled_keeps_its_session_and_its_transcript() -> None:
    """Without the session header, a layer that marks the last message for the prompt cache wrote the first
    one as a block, then (once an answer followed) as a string: the key changed and turn 2 opened a session
    of its own. A Responses `input` string sent back as an item did too, and with the header it was an edit."""
    marked = [{"type": "text", "text": "Fix a.py", "cache_control": {"type": "ephemeral"}}]
    chat = [{"messages": [{"role": "user", "content": text}]} for text in (marked, "Fix a.py", "Fix b.py")]
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix a.py"}]}
    responses = [{"input": "Fix a.py"}, {"input": [{"content": "Fix a.py", "role": "user"}]}, {"input": [item]},
                 {"input": "Fix b.py"}]  # fmt: skip
    spellings: list[tuple[ApiFormat, list[dict[str, Any]]]] = [
        (OpenAIChat(), chat), (AnthropicMessages(), chat), (OpenAIResponses(), responses)
    ]  # fmt: skip
    for api, bodies in spellings:
        *openings, other_task = [api.conversation({"model": "m", **body}).pieces for body in bodies]
        keys = {session_key(api, "sk", "", "m", pieces) for pieces in openings}
        assert len(keys) == 1 and session_key(api, "sk", "", "m", other_task) not in keys, api.api
        stored = [fingerprint(api.api, piece) for piece in openings[0]]
        for pieces in openings[1:]:
            request = [fingerprint(api.api, piece) for piece in pieces]
            assert respelled_as_stored(api, pieces, request, stored) == stored, api.api


def test_windows_come_from_the_longest_matching_prefix() -> None:
    assert context_window("claude-sonnet-4-5-20250929", {}) == 200_000
    assert context_window("gpt-4.1-mini", {}) == 1_047_576
    # GPT-5 models accept 272k input tokens (400k with the output): the trigger must stay below that.
    assert context_window("gpt-5.1-codex", {}) == context_window("gpt-5-mini-2025-08-07", {}) == 272_000
    assert context_window("gpt-5-chat-latest", {}) == 128_000
    assert context_window("my-local-model", {}) == DEFAULT_WINDOW
    assert context_window("gpt-4.1-mini", {"gpt-4.1-mini": 64_000}) == 64_000
    # Anthropic's 1M-token beta (Claude Code's sonnet[1m]), unless the gateway's settings say otherwise.
    beta = "interleaved-thinking-2025-05-14,context-1m-2025-08-07"
    assert context_window("claude-sonnet-4-5", {}, beta) == 1_000_000
    assert context_window("claude-sonnet-4-5", {}, "interleaved-thinking-2025-05-14") == 200_000
    assert context_window("claude-sonnet-4-5", {"claude": 150_000}, beta) == 150_000
    assert context_window("gpt-4o", {}, beta) == 128_000
    assert model_family("claude-sonnet-4-5-20250929") == "claude-sonnet-4-5"


# ---- pieces and payloads ----------------------------------------------------------------------------


def test_fingerprints_ignore_moved_cache_breakpoints() -> None:
    plain = Piece(Role.USER, [{"type": "text", "text": "hi"}])
    marked = Piece(Role.USER, [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}])
    assert fingerprint("anthropic_messages", plain) == fingerprint("anthropic_messages", marked)
    assert fingerprint("anthropic_messages", plain) != fingerprint("anthropic_messages", Piece(Role.USER, "hi!"))


def test_a_plain_message_carries_only_its_fingerprint() -> None:
    message = OpenAIChat().canonical(Piece(Role.USER, {"role": "user", "content": "hi"}))
    assert message.content == "hi"
    assert message.provider_payload is not None and message.provider_payload.json == ""
    developer = OpenAIChat().canonical(Piece(Role.SYSTEM, {"role": "developer", "content": "Rules."}))
    assert developer.provider_payload is not None
    assert orjson.loads(developer.provider_payload.json) == {"role": "developer", "content": "Rules."}


def test_an_anthropic_user_turn_splits_into_results_then_text() -> None:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"},
                                     {"type": "text", "text": "and then?"}]},
    ]}  # fmt: skip
    pieces = AnthropicMessages().conversation(body).pieces
    assert [p.role for p in pieces] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.USER]
    tool = AnthropicMessages().canonical(pieces[2])
    assert (tool.tool_call_id, tool.content, tool.provider_payload and tool.provider_payload.json) == ("t1", "a.py", "")


def test_responses_group_one_turns_items_into_one_assistant_message() -> None:
    body = {"model": "o4-mini", "input": [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc"},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "pwd", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
        {"type": "function_call_output", "call_id": "c2", "output": "/src"},
    ]}  # fmt: skip
    conversation = OpenAIResponses().conversation(body)
    assert [p.role for p in conversation.pieces] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL]
    turn = OpenAIResponses().canonical(conversation.pieces[1])
    assert [c.id for c in turn.tool_calls] == ["c1", "c2"]
    assert OpenAIResponses().conversation({**body, "previous_response_id": "resp_1"}).not_reconciled


# ---- attachments ----------------------------------------------------------------------------------


def test_image_sizes_come_from_their_headers() -> None:
    png = (
        b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", 1280, 800) + b"\x08\x02\x00\x00\x00"
    )
    gif = b"GIF89a" + struct.pack("<HH", 640, 480)
    jpeg = (
        b"\xff\xd8\xff\xe0"
        + struct.pack(">H", 16)
        + b"JFIF\x00"
        + b"\x00" * 9
        + b"\xff\xc0\x00\x11\x08"
        + struct.pack(">HH", 600, 1024)
        + b"\x00" * 8
    )
    assert image_size(png) == (1280, 800)
    assert image_size(gif) == (640, 480)
    assert image_size(jpeg) == (1024, 600)
    assert image_size(b"not an image") == (0, 0)
    assert base64.b64encode(png)  # what the formats decode


def test_image_token_formulas() -> None:
    assert anthropic_image_tokens(1000, 1000) == 1334  # 1000 x 1000 / 750
    assert anthropic_image_tokens(4000, 3000) <= 1600  # scaled down first
    assert openai_image_tokens(1024, 1024) == 765  # scaled to 768 x 768: 4 tiles
    assert openai_image_tokens(4096, 8192, "low") == 85
    assert openai_image_tokens(2048, 4096) == 1105  # 768 x 1536: 6 tiles


# ---- cache breakpoints ----------------------------------------------------------------------------


def test_breakpoints_mark_the_stable_prefix_and_the_last_turn() -> None:
    turns = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "next"},
    ]
    body = {"system": "Rules.", "messages": turns}
    placed = place_breakpoints(body, stable_turns=1)
    assert placed["messages"][0]["content"] == [
        {"type": "text", "text": "task", "cache_control": {"type": "ephemeral"}}
    ]
    assert placed["messages"][2]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert placed["messages"][1]["content"] == "ok"
    assert body["messages"][0]["content"] == "task"  # the agent's request is not changed in place
    only_system = place_breakpoints({"system": "Rules.", "messages": [{"role": "user", "content": "x"}]}, 0)
    assert only_system["system"][-1]["cache_control"] == {"type": "ephemeral"}


def test_automatic_caching_takes_one_of_the_four_breakpoints() -> None:
    """A top-level `cache_control` (Anthropic's automatic caching) places a breakpoint of its own: the
    explicit ones left beside it are three, the agent's in messages going first."""
    mark = {"type": "ephemeral"}
    body = {
        "cache_control": mark,
        "system": [{"type": "text", "text": "Rules.", "cache_control": mark}, {"type": "text", "text": "More."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q0", "cache_control": mark}]},
            {"role": "assistant", "content": "a0"},
            {"role": "user", "content": [{"type": "text", "text": "q1", "cache_control": mark}]},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "q2"},
        ],
    }
    placed = place_breakpoints(body, stable_turns=0)
    explicit = [n for n, m in enumerate(placed["messages"]) if b"cache_control" in orjson.dumps(m)]
    assert placed["cache_control"] == mark and all(block["cache_control"] == mark for block in placed["system"])
    assert explicit == [4]  # the agent's two in messages gave way: two on the system, the last turn, the automatic one


def test_thinking_blocks_never_get_a_breakpoint() -> None:
    turn = [{"type": "text", "text": "a"}, {"type": "thinking", "thinking": "t", "signature": "s"}]
    placed = place_breakpoints({"messages": [{"role": "assistant", "content": turn}]}, 1)
    assert "cache_control" not in placed["messages"][0]["content"][1]
    assert placed["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}


# ---- SSE and usage --------------------------------------------------------------------------------


def test_events_are_cut_whole_whatever_the_chunks() -> None:
    stream = b'event: a\ndata: {"x": 1}\n\n' + b"data: [DONE]\r\n\r\n"
    for cut in range(1, len(stream)):
        splitter = EventSplitter()
        events = [*splitter.feed(stream[:cut]), *splitter.feed(stream[cut:])]
        assert b"".join(e.raw for e in events) == stream
        assert [e.data for e in events] == [{"x": 1}, None]


def test_an_event_in_many_chunks_is_searched_once_not_once_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Responses image arrives as megabytes of base64 in one event: searched whole on every chunk, an
    8 MiB event in 16 KiB chunks held the event loop for 16 s. The bytes searched are counted, not timed."""
    searched: list[int] = []
    end = sse._EVENT_END

    class CountingEnd:
        def finditer(self, buffer: bytearray, start: int = 0) -> Iterator[re.Match[bytes]]:
            searched.append(len(buffer) - start)
            return end.finditer(buffer, start)

    monkeypatch.setattr(sse, "_EVENT_END", CountingEnd())
    stream = b"data: " + orjson.dumps({"image": "A" * (8 << 20)}) + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    splitter = EventSplitter()
    events = [event for at in range(0, len(stream), 16384) for event in splitter.feed(stream[at : at + 16384])]
    assert [len(e.raw) for e in events] == [len(stream) - 16, 16] and events[0].data is not None
    assert sum(searched) <= len(stream) + 4 * len(searched)  # each byte once, and an end's overlap per chunk
    byte_by_byte = EventSplitter()
    small = b'event: a\ndata: {"x": 1}\n\n' + b"data: [DONE]\r\n\r\n" + b"data: 2\r\r"
    events = [event for at in range(len(small)) for event in byte_by_byte.feed(small[at : at + 1])]
    assert b"".join(e.raw for e in events) == small and len(events) == 3 and not byte_by_byte.rest()


def test_usage_is_reported_every_interval_and_after_every_fold() -> None:
    assert should_observe(None, 100.0, Action.NONE)
    assert not should_observe(100.0, 101.0, Action.NONE)
    assert should_observe(100.0, 101.0, Action.FOLDED)
    assert should_observe(100.0, 100.0 + OBSERVE_INTERVAL_SECONDS, Action.NONE)


def test_fingerprints_of_an_unchanged_prefix_are_reused_and_only_new_pieces_hashed() -> None:
    first = [Piece(Role.SYSTEM, "Be brief."), Piece(Role.USER, {"role": "user", "content": "hi"})]
    known, known_json = request_fingerprints("openai_chat", first, [], b"")
    assert known == [fingerprint("openai_chat", p) for p in first]
    longer = [*first, Piece(Role.ASSISTANT, {"role": "assistant", "content": "ok"})]
    stale = ["not", "hashed"]  # reused as given: the bytes vouch for them
    assert request_fingerprints("openai_chat", longer, stale, known_json)[0][:2] == stale
    edited = [first[0], Piece(Role.USER, {"role": "user", "content": "hello"}), longer[2]]
    assert request_fingerprints("openai_chat", edited, stale, known_json)[0] == [
        fingerprint("openai_chat", p) for p in edited
    ]
    # a first piece that merely starts like the old one is no prefix
    grown = [Piece(Role.SYSTEM, "Be brief."), Piece(Role.USER, {"role": "user", "content": "hi", "name": "x"})]
    assert request_fingerprints("openai_chat", grown, stale, known_json)[0][1] == fingerprint("openai_chat", grown[1])


def test_a_native_summary_goes_to_its_own_api_family_as_its_item_and_to_others_as_text() -> None:
    """A summary made by the provider's own compaction is re-sent byte for byte to that family, the
    engine's sections as text beside it; another family gets the text alone (it cannot read the item)."""
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "enc:abc"}
    payload = ProviderPayload("openai_responses", orjson.dumps(item).decode())
    task = Message(role=Role.USER, content="Fix the test", seq=1)
    summary = Message(role=Role.USER, content="## Standing instructions", summary=True, provider_payload=payload)
    assert native_summary(summary, "openai_responses") == [item, {"role": "user", "content": summary.content}]
    assert native_summary(summary, "openai_chat") is None
    assert native_summary(task, "openai_responses") is None
    body = OpenAIResponses().rewritten(
        {"model": "m", "input": []},
        [
            ViewEntry(task, {"role": "user", "content": "Fix the test"}),
            ViewEntry(summary, native_summary(summary, "openai_responses")),
        ],
        CacheHints("k", 0),
    )
    assert body["input"][1] == item and body["input"][2]["content"] == summary.content
    block = {"type": "compaction", "content": "the summary", "signature": "sig_1"}
    anthropic_payload = ProviderPayload("anthropic_messages", orjson.dumps(block).decode())
    anthropic = Message(role=Role.USER, content="## Artifacts", summary=True, provider_payload=anthropic_payload)
    sent = AnthropicMessages().rewritten(
        {"model": "m", "max_tokens": 10, "messages": []},
        [ViewEntry(anthropic, native_summary(anthropic, "anthropic_messages"))],
        CacheHints("", 0),
    )
    assert sent["messages"][0]["content"][0] == block
    assert sent["messages"][0]["content"][1]["text"] == "## Artifacts"
