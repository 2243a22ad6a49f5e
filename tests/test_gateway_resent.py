"""A resent request recognized by its bytes (`gateway/resent.py`), directly: where a request's
history closes, what a resent request inserts, when a view only grew, the upstream body's cut."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from ctxfold_client import Action, Message, Role, View

from ctxfold.engine import estimator
from ctxfold.gateway import resent
from ctxfold.gateway.formats import Conversation
from ctxfold.gateway.resent import (
    Forwarded,
    continued,
    grew_by,
    history_close,
    inserted,
    likely_grows,
    new_items,
    split_json,
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
    return Forwarded(raw[:close], raw[close:], head, tail, conversation, Role.USER, shown, False)


@pytest.mark.parametrize("encode", [compact, spaced])
def test_a_resent_request_inserts_its_new_messages_and_nothing_else(encode: Any) -> None:
    body = {"model": "gpt-4.1", "messages": HISTORY, "temperature": 0.2}
    forwarded = forwarded_of(body, encode)
    resent = encode({**body, "messages": [*HISTORY, NEW, NEW]})
    middle = inserted(forwarded, resent)
    assert middle is not None and middle[:1] == b","
    assert new_items(middle) == [NEW, NEW]
    spliced = forwarded.upstream_head + middle + forwarded.upstream_tail
    assert orjson.loads(spliced) == {**body, "messages": [*HISTORY, NEW, NEW]}


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
    after = continued(forwarded, middle, view_of(*shown, *appended), Role.USER)
    assert after.head == forwarded.head + middle and after.upstream_head == forwarded.upstream_head + middle
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
