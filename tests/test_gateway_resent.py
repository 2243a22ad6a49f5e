"""A resent request recognized by its bytes (`gateway/resent.py`), directly: where a request's
history closes, what a resent request inserts, when a view only grew, the upstream body's cut, and
Anthropic's breakpoints (left out of the comparison, moved with the turns upstream)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from ctxfold_client import Action, Message, Role, View

from ctxfold.engine import estimator
from ctxfold.gateway import resent
from ctxfold.gateway.formats import Conversation, Spliced, split_json
from ctxfold.gateway.formats.anthropic_messages import AnthropicMessages
from ctxfold.gateway.pieces import without_cache_control
from ctxfold.gateway.resent import (
    Forwarded,
    continued,
    grew_by,
    history_close,
    inserted,
    likely_grows,
    new_items,
    spliced,
)

HISTORY = [{"role": "system", "content": "You are careful."}, {"role": "user", "content": "Fix a.py"}]
NEW = {"role": "user", "content": 'and b.py, with "quotes" and ] brackets'}


def compact(value: Any) -> bytes:
    return orjson.dumps(value)


def spaced(value: Any) -> bytes:  # Python's json.dumps: ", " and ": " separators
    return json.dumps(value).encode()


@pytest.mark.parametrize("encode", [compact, spaced])
@pytest.mark.parametrize(
    "body",
    [
        {"model": "gpt-4.1", "messages": HISTORY, "tools": [{"type": "function"}]},
        {"messages": HISTORY, "model": "gpt-4.1"},
        {"model": "gpt-4.1", "messages": HISTORY},  # the history last
        # a decoy: an array inside the history followed by a key named like the next top-level one
        {"messages": [*HISTORY, {"role": "user", "content": [{"type": "text"}], "model": "m"}], "model": "m"},
    ],
)
def test_the_history_closes_where_one_more_item_would_go(encode: Any, body: dict[str, Any]) -> None:
    raw = encode(body)
    close = history_close(raw, body, "messages")
    assert close is not None and raw[close : close + 1] == b"]"
    grown = orjson.loads(raw[:close] + b"," + encode(NEW) + raw[close:])
    assert grown == {**body, "messages": [*body["messages"], NEW]}


@pytest.mark.parametrize(
    "body",
    [
        {"model": "gpt-4.1", "messages": []},  # nothing to insert after
        {"model": "gpt-4.1", "messages": "hello"},  # not an array
        {"model": "gpt-4.1"},  # no history at all
    ],
)
def test_no_close_is_claimed_where_none_can_be_proven(body: dict[str, Any]) -> None:
    assert history_close(compact(body), body, "messages") is None


def test_a_key_written_with_escapes_is_not_found_rather_than_guessed() -> None:
    raw = b'{"messages":[{"role":"user","content":"hi"}],"mod\\u0065l":"gpt-4.1"}'
    assert history_close(raw, orjson.loads(raw), "messages") is None


def forwarded_of(body: dict[str, Any], encode: Any = compact, view: View | None = None) -> Forwarded:
    raw = encode(body)
    close = history_close(raw, body, "messages")
    assert close is not None
    head, tail = split_json(body, "messages")
    conversation = Conversation(pieces=(), model="gpt-4.1", stream=False, max_output_tokens=0, tools=())
    shown = view or view_of(Message(role=Role.SYSTEM, content="s", seq=1))
    return Forwarded(raw[:close], raw[close:], Spliced(head, -1), tail, conversation, Role.USER, shown, False)


@pytest.mark.parametrize("encode", [compact, spaced])
def test_a_resent_request_inserts_its_new_messages_and_nothing_else(encode: Any) -> None:
    body = {"model": "gpt-4.1", "messages": HISTORY, "temperature": 0.2}
    forwarded = forwarded_of(body, encode)
    resent = encode({**body, "messages": [*HISTORY, NEW, NEW]})
    middle = inserted(forwarded, resent)
    assert middle is not None and middle[:1] == b","
    assert new_items(middle) == [NEW, NEW]
    upstream = spliced(forwarded, Spliced(middle, -1), b"")
    assert orjson.loads(upstream) == {**body, "messages": [*HISTORY, NEW, NEW]}


@pytest.mark.parametrize(
    "changed",
    [
        {"model": "gpt-4.1", "messages": [*HISTORY, NEW], "temperature": 0.9},  # another field changed too
        {"model": "gpt-4.1", "messages": [HISTORY[0], {"role": "user", "content": "Fix a.py now"}], "temperature": 0.2},
        {"model": "gpt-4.1", "messages": HISTORY, "temperature": 0.2},  # the same request again
        {"model": "gpt-4.1", "messages": HISTORY[:1], "temperature": 0.2},  # a retry: shorter
    ],
)
def test_anything_but_appended_messages_is_not_a_resent_request(changed: dict[str, Any]) -> None:
    forwarded = forwarded_of({"model": "gpt-4.1", "messages": HISTORY, "temperature": 0.2})
    assert inserted(forwarded, compact(changed)) is None


def test_inserted_bytes_that_are_no_json_values_give_no_items() -> None:
    assert new_items(b',{"role":') is None
    assert new_items(b",") is None


def test_the_upstream_body_is_cut_before_its_history_closes() -> None:
    body = {"model": "gpt-4.1", "messages": HISTORY, "prompt_cache_key": "k"}
    head, tail = split_json(body, "messages")
    assert orjson.loads(head + tail) == body
    assert tail[:1] == b"]"
    assert orjson.loads(split_json({"messages": HISTORY}, "messages")[0] + b"]}") == {"messages": HISTORY}


def view_of(*messages: Message) -> View:
    return View(messages=messages, estimated_tokens=1, view_version=1, action=Action.NONE, trigger_tokens=5000)


def test_a_view_grew_only_when_its_prefix_is_the_forwarded_view_and_the_new_messages_show_whole() -> None:
    shown = (Message(role=Role.SYSTEM, content="s", seq=1), Message(role=Role.USER, content="u", seq=2))
    forwarded = forwarded_of({"messages": HISTORY}, view=view_of(*shown))
    appended = (Message(role=Role.USER, content="n", seq=3),)
    assert grew_by(forwarded, view_of(*shown, *appended), appended, reserve=0)
    # A forwarded body offering the read tool keeps it only while the view leaves the tool its room.
    assert grew_by(forwarded, view_of(*shown, *appended), appended, reserve=4999)
    assert not grew_by(forwarded, view_of(*shown, *appended), appended, reserve=5000)
    truncated = Message(role=Role.USER, content="n…", seq=3, truncated=True)
    assert not grew_by(forwarded, view_of(*shown, truncated), appended, reserve=0)
    pruned_prefix = (shown[0], Message(role=Role.USER, content="[pruned]", seq=2, pruned=True))
    assert not grew_by(forwarded, view_of(*pruned_prefix, *appended), appended, reserve=0)
    summary = Message(role=Role.SYSTEM, content="summary", seq=0, summary=True)
    assert not grew_by(forwarded, view_of(shown[0], summary, *appended), appended, reserve=0)
    middle = b',{"role":"user","content":"n"}'
    after = continued(forwarded, middle, Spliced(middle, -1), view_of(*shown, *appended), Role.USER)
    assert after.head == forwarded.head + middle
    assert after.upstream_head == Spliced(forwarded.upstream_head.json + middle, -1)
    assert after.tail == forwarded.tail and after.view.messages[-1] is appended[0]


def test_a_view_likely_grows_while_the_new_bytes_cannot_reach_the_trigger_or_the_bound_of_a_result() -> None:
    def forwarded_at(estimated: int) -> Forwarded:
        view = View(messages=(), estimated_tokens=estimated, view_version=1, action=Action.NONE, trigger_tokens=10_000)
        return forwarded_of({"messages": HISTORY}, view=view)

    middle = b"," + b"x" * 999  # 1,000 bytes: at most 2,000 tokens at the highest calibration
    assert likely_grows(forwarded_at(7_999), middle, tool_content_max_bytes=4096, reserve=0)
    assert not likely_grows(forwarded_at(8_000), middle, tool_content_max_bytes=4096, reserve=0)  # a prune may be due
    assert not likely_grows(forwarded_at(0), middle, tool_content_max_bytes=999, reserve=0)  # a result may be cut
    # A request offering the read tool keeps its room: else it is rewritten without it.
    assert not likely_grows(forwarded_at(7_999), middle, tool_content_max_bytes=4096, reserve=1)
    assert resent.MAX_CALIBRATION == estimator.MAX_CALIBRATION  # the server's, which the gateway does not import


MARK = {"type": "ephemeral"}


@pytest.mark.parametrize("encode", [compact, spaced])
def test_anthropic_requests_are_compared_without_their_breakpoints(encode: Any) -> None:
    body = {
        "system": [{"cache_control": MARK, "type": "text", "text": "Rules."}],  # the object's first member
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": 'say "cache_control": {}', "cache_control": MARK}]},
            {"role": "assistant", "content": [{"cache_control": MARK}]},  # its only member
        ],
        "tools": [{"name": "bash", "cache_control": {"type": "ephemeral", "ttl": "1h"}, "input_schema": {}}],
    }  # fmt: skip
    comparable = AnthropicMessages().comparable(encode(body))
    assert orjson.loads(comparable) == without_cache_control(body)
    assert b'say \\"cache_control\\": {}' in comparable  # text is text
    assert AnthropicMessages().comparable(encode(without_cache_control(body))) == comparable


def test_an_anthropic_body_spliced_moves_its_two_breakpoints_with_the_turns() -> None:
    """The upstream body of each resent request: the previous one with the new turns inserted, a breakpoint
    at the end of the previous body's last turn (now the end of its stable prefix) and at the new last turn,
    none elsewhere in the history; the system prompt's as the full path left them."""
    api = AnthropicMessages()
    history = [{"role": "user", "content": "Fix a.py", "cache_control": MARK}, {"role": "assistant", "content": "ok"}]
    history[1]["content"] = [{"type": "text", "text": "ok", "cache_control": MARK}]
    body = {"model": "claude-sonnet-4-6", "system": [{"type": "text", "text": "Rules.", "cache_control": MARK}],
            "messages": [*history, {"role": "user", "content": [{"type": "text", "text": "and b.py"}]}]}  # fmt: skip
    cut = api.history_cut(body)
    assert cut is not None
    head, tail = cut
    forwarded = Forwarded(b"", b"", head, tail, Conversation((), "m", False, 0, ()), Role.USER, view_of(), False)
    sent = list(body["messages"])
    for turn in range(3):
        blocks = [
            {"type": "tool_result", "tool_use_id": f"t{turn}", "content": "x"},
            {"type": "thinking", "thinking": "t"},
        ]
        new = [{"role": "assistant", "content": f"done {turn}"}, {"role": "user", "content": blocks}]
        middle = b"," + b",".join(orjson.dumps(item) for item in new)
        items = api.spliced_items(middle, new)
        upstream = orjson.loads(spliced(forwarded, items, api.breakpoint))
        sent += new
        assert without_cache_control(upstream) == without_cache_control({**body, "messages": sent})
        marks = [n for n, m in enumerate(upstream["messages"]) if b"cache_control" in orjson.dumps(m)]
        count = len(upstream["messages"])
        assert marks == [count - 3, count - 1]
        assert upstream["messages"][-1]["content"][0]["cache_control"] == MARK  # not on the thinking block
        assert upstream["system"] == body["system"]
        forwarded = continued(forwarded, middle, items, view_of(), Role.USER)


def test_no_anthropic_body_is_kept_for_splicing_when_its_two_breakpoints_would_be_too_many() -> None:
    marked_tools = [{"name": f"t{n}", "input_schema": {}, "cache_control": MARK} for n in range(3)]
    body = {"tools": marked_tools, "messages": [{"role": "user", "content": "hi"}]}
    assert AnthropicMessages().history_cut(body) is None
    assert AnthropicMessages().history_cut({**body, "tools": marked_tools[:2]}) is not None
