"""The gateway under the official `anthropic` Python SDK: thinking blocks whose signatures arrive
byte-exact, images (described in canonical, counted by Anthropic's formula), streams, cache
breakpoints within the provider's four, appended turns recognized by their bytes while the agent
moves its breakpoints."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import orjson
from ctxfold_client import Role
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ctxfold.gateway.attachments import anthropic_image_tokens
from ctxfold.gateway.formats.anthropic_cache import MAX_BREAKPOINTS, count_breakpoints
from ctxfold.gateway.pieces import without_cache_control
from fake_upstream import MESSAGES, Call, Reply
from gateway_fixtures import Stack, anthropic_agent, stack
from test_telemetry import spans

__all__ = ["spans", "stack"]

SIGNATURE = "EqQBCkgIBRABGAIiQJ3+/sig/with=odd+bytes" + "A" * 64


def png(width: int, height: int) -> str:
    """A tiny valid PNG header of the given size (the gateway reads only the header)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    data = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return base64.b64encode(data + b"\x00" * 64).decode()


async def test_thinking_signatures_reach_the_upstream_byte_exact(stack: Stack) -> None:
    agent = anthropic_agent(stack.url, "thinking")
    stack.upstream.reply(
        MESSAGES,
        Reply(
            text="", thinking=(("I should list the files.", SIGNATURE),), calls=(Call("toolu_1", "bash", '{"c":"ls"}'),)
        ),
        Reply(text="There are two files."),
    )
    messages: list[dict[str, object]] = [{"role": "user", "content": "What is here?"}]
    kwargs = {"model": "claude-sonnet-4-6", "max_tokens": 2048, "system": "You are terse.",
              "thinking": {"type": "enabled", "budget_tokens": 1024}}  # fmt: skip
    first = await agent.messages.create(messages=messages, **kwargs)  # type: ignore[arg-type]
    messages.append({"role": "assistant", "content": [block.model_dump() for block in first.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a b"}]})
    raw = await agent.messages.with_raw_response.create(messages=messages, **kwargs)  # type: ignore[arg-type]
    assert raw.http_response.content == stack.upstream.sent[-1]
    seen = stack.upstream.last(MESSAGES)
    assert f'"signature":"{SIGNATURE}"'.encode() in seen.raw
    sent = seen.body
    assert sent["thinking"] == kwargs["thinking"] and sent["max_tokens"] == 2048
    assert sent["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "I should list the files.",
        "signature": SIGNATURE,
    }
    transcript = await stack.transcript(raw.headers["x-ctxfold-session"])
    assert [m.role.name for m in transcript] == ["SYSTEM", "USER", "ASSISTANT", "TOOL"]
    assert transcript[2].reasoning_content == "I should list the files."
    assert transcript[2].provider_payload is not None and SIGNATURE in transcript[2].provider_payload.json


async def test_an_image_is_described_in_canonical_and_counted(stack: Stack) -> None:
    agent = anthropic_agent(stack.url, "image")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png(1280, 800)}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "What does this screenshot show?"}]}]
    raw = await agent.messages.with_raw_response.create(model="claude-sonnet-4-6", max_tokens=512, messages=messages)  # type: ignore[arg-type]
    user = (await stack.transcript(raw.headers["x-ctxfold-session"]))[0]
    assert user.content == "[image: image/png, 1280x800]\nWhat does this screenshot show?"
    assert user.provider_payload is not None
    assert user.provider_payload.tokens == anthropic_image_tokens(1280, 800)
    assert user.tokens > user.provider_payload.tokens
    sent = stack.upstream.last(MESSAGES).body["messages"][0]["content"]
    assert sent[0] == image


async def test_a_stream_passes_through_unchanged(stack: Stack) -> None:
    agent = anthropic_agent(stack.url, "stream")
    stack.upstream.reply(MESSAGES, Reply(text="Streamed answer.", thinking=(("hmm", SIGNATURE),)))
    async with agent.messages.with_streaming_response.create(
        model="claude-sonnet-4-6", max_tokens=512, stream=True, messages=[{"role": "user", "content": "Go."}]
    ) as response:
        received = b"".join([chunk async for chunk in response.iter_bytes()])
    assert received == stack.upstream.sent[-1]
    async with agent.messages.stream(
        model="claude-sonnet-4-6", max_tokens=512, messages=[{"role": "user", "content": "Go."}]
    ) as events:
        message = await events.get_final_message()
    assert message.content[0].type == "text"


async def test_cache_breakpoints_stay_within_four_keeping_the_agents_last(stack: Stack) -> None:
    agent = anthropic_agent(stack.url, "breakpoints")
    marked = {"type": "ephemeral"}
    system = [
        {"type": "text", "text": "Rules.", "cache_control": marked},
        {"type": "text", "text": "More.", "cache_control": marked},
    ]
    messages: list[dict[str, object]] = []
    for turn in range(4):
        messages.append(
            {"role": "user", "content": [{"type": "text", "text": f"question {turn}", "cache_control": marked}]}
        )
        messages.append({"role": "assistant", "content": f"answer {turn}"})
    messages.append({"role": "user", "content": "last question"})
    await agent.messages.create(model="claude-sonnet-4-6", max_tokens=512, system=system, messages=messages)  # type: ignore[arg-type]
    sent = stack.upstream.last(MESSAGES).body
    assert count_breakpoints(sent) == MAX_BREAKPOINTS
    assert sent["messages"][-1]["content"][-1]["cache_control"] == marked  # the gateway's, on the last turn
    assert sent["system"] == system  # the agent's own on the system prompt still apply


async def test_count_tokens_and_models_pass_through(stack: Stack) -> None:
    agent = anthropic_agent(stack.url, "pass")
    raw = await agent.messages.with_raw_response.count_tokens(
        model="claude-sonnet-4-6", messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.http_response.content == stack.upstream.sent[-1]
    assert orjson.loads(orjson.loads(raw.http_response.content)["echo"])["messages"][0]["content"] == "hi"


async def test_the_one_million_token_beta_gives_a_new_session_that_window(stack: Stack) -> None:
    agent = anthropic_agent(stack.url, "one-million")
    answer = await agent.beta.messages.with_raw_response.create(
        model="claude-sonnet-4-6",
        max_tokens=1024,
        messages=[{"role": "user", "content": "Read the whole repository."}],
        betas=["context-1m-2025-08-07"],
    )
    session = await stack.ctxfold.get_session(answer.headers["x-ctxfold-session"])
    assert session.config.context_window == 1_000_000
    assert "context-1m-2025-08-07" in stack.upstream.last(MESSAGES).headers.get("anthropic-beta", "")


def marked_turns(body: dict[str, Any]) -> list[int]:
    """The indices of the messages that carry a cache breakpoint."""
    return [n for n, m in enumerate(body["messages"]) if "cache_control" in orjson.dumps(m["content"]).decode()]


async def test_turns_are_recognized_by_bytes_while_the_agent_moves_its_breakpoint(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """The agent marks its last turn each time, as Claude Code does. Its appended turns are still
    recognized by their bytes (sent upstream while the Prepare runs: the history is not parsed again),
    thinking signatures arrive byte-exact, and the upstream gets the agent's history with breakpoints
    at the end of the previous view (its stable prefix) and at the last turn, beside the agent's own
    on the system prompt."""
    agent = anthropic_agent(stack.url, "moving-breakpoints")
    calls = [
        Reply(text="", thinking=((f"step {n}", SIGNATURE),), calls=(Call(f"toolu_{n}", "bash", "{}"),))
        for n in range(5)
    ]
    stack.upstream.reply(MESSAGES, *calls)
    marked = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are a careful coding agent. " * 12, "cache_control": marked}]
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Fix a.py: " + "it fails. " * 30, "cache_control": marked}],
        }
    ]
    for turn in range(5):
        spans.clear()
        request: dict[str, Any] = {
            "model": "claude-sonnet-4-6",
            "max_tokens": 512,
            "system": system,
            "messages": messages,
        }
        if turn < 3:
            answer = await agent.messages.create(**request)
        else:  # streamed: the first such request changes a field, so it takes the full path
            async with agent.messages.stream(**request) as events:
                answer = await events.get_final_message()
        seen = stack.upstream.last(MESSAGES)
        sent = seen.body
        assert without_cache_control(sent["messages"]) == without_cache_control(messages), turn
        assert sent["system"] == system and count_breakpoints(sent) <= MAX_BREAKPOINTS
        gateway = next(s for s in spans.get_finished_spans() if s.name == "chat claude-sonnet-4-6")
        early = dict(gateway.attributes or {}).get("ctxfold.gateway.early_call")
        assert early == (None if turn in (0, 3) else "used"), turn  # the first request creates the session
        if early:
            assert marked_turns(sent) == [len(messages) - 3, len(messages) - 1], turn
            assert f'"signature":"{SIGNATURE}"'.encode() in seen.raw
        for message in messages:  # the agent keeps one breakpoint, on its last turn
            for block in message["content"]:
                block.pop("cache_control", None)
        messages.append({"role": "assistant", "content": [block.model_dump() for block in answer.content]})
        result = {
            "type": "tool_result",
            "tool_use_id": f"toolu_{turn}",
            "content": f"output {turn}",
            "cache_control": marked,
        }
        messages.append({"role": "user", "content": [result]})
    session_id = (
        await agent.messages.with_raw_response.create(
            model="claude-sonnet-4-6", max_tokens=512, system=system, messages=messages
        )
    ).headers["x-ctxfold-session"]  # type: ignore[arg-type]
    assert len(await stack.transcript(session_id)) == 1 + len(messages)  # the system prompt, then every turn's pieces


async def test_an_edit_after_turns_recognized_by_bytes_rewinds_and_the_next_turn_is_recognized_again(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """The person edits an earlier message while the agent moves its breakpoint: the transcript is
    rewound to just before it (the abandoned branch stays readable), the upstream gets the edited
    history, and the turn after is recognized by its bytes again."""
    agent = anthropic_agent(stack.url, "edit-after-resent")
    marked = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are a careful coding agent. " * 12, "cache_control": marked}]

    def turns(edited: bool, count: int) -> list[dict[str, Any]]:
        """`count` turns, the last one's message marked (as the agent marks its last turn each time)."""
        out: list[dict[str, Any]] = []
        for n in range(count):
            text = f"step {n}: " + ("do it differently. " if edited and n == 1 else "go on. ") * 20
            if out:
                out.append({"role": "assistant", "content": [{"type": "text", "text": f"done {n - 1}"}]})
            out.append({"role": "user", "content": [{"type": "text", "text": text}]})
        out[-1]["content"][0]["cache_control"] = marked
        return out

    async def send(messages: list[dict[str, Any]]) -> tuple[str, object]:
        spans.clear()
        raw = await agent.messages.with_raw_response.create(
            model="claude-sonnet-4-6", max_tokens=64, system=system, messages=messages
        )  # type: ignore[arg-type]
        gateway = next(s for s in spans.get_finished_spans() if s.name == "chat claude-sonnet-4-6")
        assert without_cache_control(stack.upstream.last(MESSAGES).body["messages"]) == without_cache_control(messages)
        return raw.headers["x-ctxfold-session"], dict(gateway.attributes or {}).get("ctxfold.gateway.early_call")

    for count in (3, 4, 5):
        session_id, early = await send(turns(False, count))
    assert early == "used"
    _, early = await send(turns(True, 6))  # message 1 edited: the full path, a rewind
    assert early is None
    live = await stack.transcript(session_id)
    assert any("do it differently" in m.content for m in live) and not any(
        m.content.startswith("step 1: go on") for m in live
    )
    abandoned = [m for m in await stack.transcript(session_id, include_abandoned=True) if m.abandoned]
    assert any(m.content.startswith("step 1: go on") for m in abandoned)
    _, early = await send(turns(True, 7))
    assert early == "used"


def text_of(message: dict[str, Any]) -> tuple[str, str]:
    content = message["content"]
    return message["role"], content if isinstance(content, str) else "".join(b["text"] for b in content)


async def test_a_message_respelled_when_it_is_no_longer_last_is_not_an_edit(stack: Stack) -> None:
    """The agent writes its last message as one marked text block and, once an answer follows it, as a
    plain string again (as cache-marking layers over chat histories do): the transcript is appended
    to, never rewound, and the upstream gets the history as the agent wrote it."""
    agent = anthropic_agent(stack.url, "respelled")
    marked = {"type": "ephemeral"}
    said: list[str] = [f"step 0: {'go on. ' * 50}"]
    session_id = ""
    for turn in range(4):
        *before, last = said
        messages: list[dict[str, Any]] = []
        for n, text in enumerate(before):
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": f"done {n}"}]
        messages.append({"role": "user", "content": [{"type": "text", "text": last, "cache_control": marked}]})
        raw = await agent.messages.with_raw_response.create(model="claude-sonnet-4-6", max_tokens=64, messages=messages)  # type: ignore[arg-type]
        session_id = raw.headers["x-ctxfold-session"]
        sent = stack.upstream.last(MESSAGES).body["messages"]
        assert [text_of(m) for m in sent] == [text_of(m) for m in messages]  # breakpoints put text in blocks
        said.append(f"step {turn + 1}")
    transcript = await stack.transcript(session_id, include_abandoned=True)
    assert not [m for m in transcript if m.abandoned]
    assert [m.content for m in transcript if m.role is Role.USER] == said[:-1]


async def test_integers_beyond_64_bits_in_tool_inputs_reach_the_upstream_and_the_transcript_as_written(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """orjson reads such an integer as a float (1.2345678901234568e+22): the upstream got another number than
    the agent's, on the full path and, once that body was kept, on every turn recognized by its bytes after it.
    The turn recognized by its bytes reads its new messages as the full path does: a request taking the full
    path afterwards (another field changed) finds the same fingerprints and rewinds nothing."""
    agent = anthropic_agent(stack.url, "big-integers")
    big, bigger = "12345678901234567890123", "-98765432109876543210987654321"

    def looked_up(call_id: str, number: str, result: str) -> list[dict[str, Any]]:
        call = {"type": "tool_use", "id": call_id, "name": "order", "input": {"id": int(number)}}
        answer = {"type": "tool_result", "tool_use_id": call_id, "content": result}
        return [{"role": "assistant", "content": [call]}, {"role": "user", "content": [answer]}]

    messages = [{"role": "user", "content": f"Look up order {big}. " * 8}, *looked_up("toolu_a", big, "shipped")]
    session_id = ""
    for turn, (max_tokens, number) in enumerate([(64, big), (64, bigger), (65, bigger)]):
        spans.clear()
        raw = await agent.messages.with_raw_response.create(
            model="claude-sonnet-4-6", max_tokens=max_tokens, messages=messages
        )  # type: ignore[arg-type]
        session_id = raw.headers["x-ctxfold-session"]
        gateway = next(s for s in spans.get_finished_spans() if s.name == "chat claude-sonnet-4-6")
        assert dict(gateway.attributes or {}).get("ctxfold.gateway.early_call") == ("used" if turn == 1 else None)
        seen = stack.upstream.last(MESSAGES).raw
        assert f'"input":{{"id":{big}}}'.encode() in seen and f'"id":{number}}}'.encode() in seen, turn
        if turn == 0:
            messages += looked_up("toolu_b", bigger, "lost")
    transcript = await stack.transcript(session_id, include_abandoned=True)
    assert not [m for m in transcript if m.abandoned]
    assert [c.arguments for m in transcript for c in m.tool_calls] == [f'{{"id":{big}}}', f'{{"id":{bigger}}}']
