"""Splicing the read tool's rounds into one stream, event by event (pure): the read call's events
are dropped and later indexes close the gap, a continued turn's end is held back, the next round's
opening is dropped and its indexes continue; untouched events keep their bytes."""

from __future__ import annotations

from typing import Any

from ctxfold.gateway.splice import AnthropicSplicer, ChatSplicer, ResponsesSplicer, Splicer


def block_events(index: int, block: dict[str, Any], delta: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": block},
        {"type": "content_block_delta", "index": index, "delta": delta},
        {"type": "content_block_stop", "index": index},
    ]


def anthropic_round(blocks: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {"id": "msg_1", "role": "assistant"}}]
    for index, (block, delta) in enumerate(blocks):
        events += block_events(index, block, delta)
    return [*events, {"type": "message_delta", "delta": {"stop_reason": "tool_use"}}, {"type": "message_stop"}]


def seen_by_agent(splicer: Splicer, events: list[dict[str, Any] | None]) -> list[Any]:
    """What the agent gets: the original event (its bytes kept) or the rewritten one."""
    out: list[Any] = []
    for event in events:
        step = splicer.step(event)
        if step.forward:
            out.append(("same", event) if step.data is None else ("rewritten", step.data))
    return out


def test_anthropic_rounds_become_one_message() -> None:
    splicer = AnthropicSplicer("read_tool_result")
    text = ({"type": "text", "text": ""}, {"type": "text_delta", "text": "Let me look."})
    read = (
        {"type": "tool_use", "id": "r1", "name": "read_tool_result", "input": {}},
        {"type": "input_json_delta", "partial_json": '{"result_ref": "tr_x"}'},
    )
    bash = (
        {"type": "tool_use", "id": "b1", "name": "bash", "input": {}},
        {"type": "input_json_delta", "partial_json": "{}"},
    )
    first = anthropic_round([text, read, bash])
    seen = seen_by_agent(splicer, first)  # type: ignore[arg-type]
    assert [kind for kind, _ in seen[:4]] == ["same"] * 4  # message_start and the text block, bytes unchanged
    assert [e["index"] for _, e in seen[4:]] == [1, 1, 1]  # bash closes the read call's gap
    assert not {"message_delta", "message_stop"} & {e["type"] for _, e in seen}  # the end is held back
    assert splicer.holds_end and splicer.reads == ["r1"]
    turn = splicer.turn()
    assert [b["name"] for b in turn["content"] if b["type"] == "tool_use"] == ["read_tool_result", "bash"]
    assert turn["content"][1]["input"] == {"result_ref": "tr_x"}

    splicer.next_round(can_continue=False)
    second = anthropic_round([({"type": "text", "text": ""}, {"type": "text_delta", "text": "Found it."})])
    seen = seen_by_agent(splicer, second)  # type: ignore[arg-type]
    assert [e["type"] for _, e in seen] == [
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert [e["index"] for _, e in seen[:3]] == [2, 2, 2]


def test_a_stream_without_a_read_call_is_untouched() -> None:
    splicer = ChatSplicer("read_tool_result")
    call = {"index": 0, "id": "c1", "function": {"name": "ls", "arguments": "{}"}}
    chunks: list[dict[str, Any] | None] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        None,  # [DONE]
    ]
    assert [kind for kind, _ in seen_by_agent(splicer, chunks)] == ["same"] * 4
    assert not splicer.holds_end


def test_chat_drops_the_read_call_and_renumbers_the_rest() -> None:
    splicer = ChatSplicer("read_tool_result")
    read = {"index": 0, "id": "r1", "function": {"name": "read_tool_result", "arguments": "{}"}}
    bash = {"index": 1, "id": "b1", "function": {"name": "bash", "arguments": "{}"}}
    chunks: list[dict[str, Any] | None] = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [read]}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [bash]}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        None,
    ]
    seen = seen_by_agent(splicer, chunks)
    assert [e["choices"][0]["delta"]["tool_calls"][0]["index"] for _, e in seen] == [0]  # bash only, as index 0
    assert splicer.reads == ["r1"]
    assert [c["id"] for c in splicer.turn()["choices"][0]["message"]["tool_calls"]] == ["r1", "b1"]


def test_events_of_an_odd_upstream_pass_as_they_came_without_failing_the_stream() -> None:
    """An index that is not a number, a read call's input that is not JSON: an int() or a JSON parse of
    them raised, and the agent's stream broke off with a traceback."""
    anthropic = AnthropicSplicer("read_tool_result")
    odd_index = [{"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
                 for index in ("1", None, [0], True)]  # fmt: skip
    assert [kind for kind, _ in seen_by_agent(anthropic, odd_index)] == ["same"] * 4  # type: ignore[arg-type]
    read = ({"type": "tool_use", "id": "r1", "name": "read_tool_result", "input": {}},
            {"type": "input_json_delta", "partial_json": '{"result_ref": '})  # fmt: skip
    seen_by_agent(anthropic, anthropic_round([read]))  # type: ignore[arg-type]
    assert anthropic.reads == ["r1"] and anthropic.turn()["content"][0]["input"] == {}
    chat = ChatSplicer("read_tool_result")
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0", "id": "c1", "function": {}}]}}]}
    assert seen_by_agent(chat, [chunk]) == [("same", chunk)]
    responses = ResponsesSplicer("read_tool_result")
    added = {"type": "response.output_item.added", "output_index": "0", "item": {}, "sequence_number": 0}
    assert seen_by_agent(responses, [added]) == [("same", added)]  # type: ignore[arg-type]
