"""Bounded tool results (SPEC invariant 7) and ReadToolResult paging.

The engine functions are tested directly; the server tests append real results through gRPC and
page them back from SQLite and PostgreSQL, byte for byte."""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

import grpc
import pytest
import zstandard
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from builders import append, call, create_session, prepare, result
from conftest import downgrade, fresh_database, settings_for
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.engine.tool_results import (
    DEFAULT_PAGE_BYTES,
    MAX_PAGE_BYTES,
    RawSpan,
    bound_tool_content,
    page_span,
    pictured,
    read_page,
)
from ctxfold.server import RunningServer
from ctxfold.server import start as start_server
from ctxfold.store import schema
from ctxfold.store.database import create_engine
from ctxfold.store.rows import CHUNK_BYTES
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from rpc_errors import expect_error

LIMIT = 32768  # the default tool_content_max_bytes
CHINESE = "上下文折叠服务保存完整的对话记录并按页读取工具结果检查点摘要缓存前缀稳定"
EMOJI = "😀🚀🧪🔥🎉🐍📦✅"  # 4 bytes each
OTHER = "éßøñ€™"  # 2 and 3 bytes
ASCII = "The quick brown fox jumps over the lazy dog 0123456789. "
MARKER = re.compile(
    r"\n\n\[ctxfold: tool result truncated: result_ref=(?P<ref>\S+) original_bytes=(?P<original>\d+) "
    r"kept_bytes=(?P<kept>\d+); bytes (?P<start>\d+)\.\.(?P<end>\d+) omitted\. [^\]]*\]\n\n"
)


def mixed_text(n_bytes: int, seed: int = 0) -> str:
    """Exactly `n_bytes` of UTF-8: runs of Chinese, emoji, 2-byte letters and ASCII in random order,
    so cut points fall inside characters of every width."""
    rng = random.Random(seed)
    alphabets = [CHINESE, EMOJI, OTHER, ASCII]
    parts: list[str] = []
    size = 0
    while size < n_bytes - 4:
        alphabet = rng.choice(alphabets)
        for _ in range(rng.randint(1, 40)):
            ch = rng.choice(alphabet)
            width = len(ch.encode())
            if size + width > n_bytes - 4:
                break
            parts.append(ch)
            size += width
    parts.append("x" * (n_bytes - size))
    text = "".join(parts)
    assert len(text.encode()) == n_bytes
    return text


def repeat_to(unit: str, n_bytes: int) -> str:
    """`unit` repeated to exactly n_bytes (n_bytes must be a multiple of its width)."""
    width = len(unit.encode())
    assert n_bytes % width == 0
    return unit * (n_bytes // width)


def check_bounded(text: str, max_bytes: int, ref: str) -> tuple[int, int]:
    """Asserts everything invariant 7 says about one cut; returns (head bytes, tail bytes)."""
    raw = text.encode()
    bounded = bound_tool_content(text, max_bytes, ref)
    out = bounded.content.encode("utf-8")  # a str with lone surrogates would raise here
    assert bounded.truncated
    assert len(out) <= max_bytes
    # The cut does not waste the budget: only the marker's number widths and two snaps are lost.
    assert len(out) >= max_bytes - 64
    match = MARKER.search(bounded.content)
    assert match is not None, bounded.content[:200]
    start, end = int(match["start"]), int(match["end"])
    assert match["ref"] == ref
    assert int(match["original"]) == len(raw) == bounded.raw_bytes
    assert int(match["kept"]) == start + len(raw) - end == bounded.kept_bytes
    assert 0 < start < end < len(raw)
    # Head and tail are exact slices of the original, cut on character boundaries.
    assert bounded.content == raw[:start].decode() + match.group(0) + raw[end:].decode()
    assert f'ReadToolResult(result_ref="{ref}", offset={start})' in bounded.content
    return start, len(raw) - end


# ---- bound_tool_content ------------------------------------------------------------------------


TEXTS_AT_SIZE = {
    "chinese": lambda n: repeat_to("汉", n - n % 3) + "a" * (n % 3),
    "emoji": lambda n: repeat_to("😀", n - n % 4) + "b" * (n % 4),
    "mixed": lambda n: mixed_text(n, seed=n),
}


@pytest.mark.parametrize("kind", sorted(TEXTS_AT_SIZE))
@pytest.mark.parametrize("size", [0, 1, 100, LIMIT - 1, LIMIT])
def test_results_within_the_limit_are_kept_whole(kind: str, size: int) -> None:
    text = TEXTS_AT_SIZE[kind](size)
    assert len(text.encode()) == size
    bounded = bound_tool_content(text, LIMIT, "tr_x")
    assert bounded.content == text
    assert not bounded.truncated
    assert bounded.raw_bytes == bounded.kept_bytes == size


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(repeat_to("汉", LIMIT + 1), id="chinese-just-above"),  # 32769 = 3 x 10923
        pytest.param(repeat_to("😀", LIMIT + 4), id="emoji-just-above"),
        pytest.param(mixed_text(LIMIT + 1, seed=1), id="mixed-one-byte-above"),
        pytest.param(mixed_text(LIMIT + 3, seed=2), id="mixed-three-bytes-above"),
        pytest.param(repeat_to("汉", 3 * 70000), id="chinese-210k"),
        pytest.param(repeat_to("😀", 4 * 60000), id="emoji-240k"),
        pytest.param("a" + repeat_to("😀", 4 * 20000) + "z", id="emoji-offset-by-one"),
        pytest.param("ab" + repeat_to("汉", 3 * 30000), id="chinese-offset-by-two"),
        pytest.param(mixed_text(200 * 1024, seed=3), id="mixed-200k"),
    ],
)
def test_results_above_the_limit_are_cut_with_a_marker(text: str) -> None:
    check_bounded(text, LIMIT, "tr_0123456789abcdef")


def binary_text(n_chars: int, seed: int) -> str:
    """What `cat` of a binary file prints, decoded: control characters (NUL most), text, escapes."""
    rng = random.Random(seed)
    alphabet = ["\x00"] * 6 + ["\x1b[31m", "\x07", "\x7f", "\x01", "\t", "\n", "ELF", "汉", "😀", "a"]
    return "".join(rng.choice(alphabet) for _ in range(n_chars))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("n_chars", [10, 5_000, 40_000])
def test_control_characters_are_pictured_within_the_bound_and_cut_at_raw_offsets(seed: int, n_chars: int) -> None:
    text = binary_text(n_chars, seed)
    raw = text.encode()
    bounded = bound_tool_content(text, LIMIT, "tr_0123456789abcdef")
    out = bounded.content.encode()
    assert len(out) <= LIMIT and "\x00" not in bounded.content
    assert not bounded.exact and bounded.raw_bytes == len(raw)
    match = MARKER.search(bounded.content)
    if match is None:
        assert not bounded.truncated and bounded.content == pictured(text)
        return
    start, end = int(match["start"]), int(match["end"])
    # The marker's offsets are the raw text's: head and tail are its slices, pictured.
    assert bounded.content == pictured(raw[:start].decode()) + match.group(0) + pictured(raw[end:].decode())
    assert int(match["kept"]) == start + len(raw) - end == bounded.kept_bytes


def test_only_nul_is_pictured_other_control_characters_are_kept() -> None:
    assert pictured("a\x00b\tc\nd\re\x1b[0m\x7f\x07") == "a\u2400b\tc\nd\re\x1b[0m\x7f\x07"
    assert bound_tool_content("plain \x1b[31mred\x1b[0m text", LIMIT, "tr_x").exact


@pytest.mark.parametrize("seed", range(40))
def test_cuts_land_on_char_boundaries_for_many_sizes(seed: int) -> None:
    rng = random.Random(seed)
    max_bytes = rng.choice([4096, 5000, 8191, LIMIT, 65536])
    text = mixed_text(max_bytes + rng.randint(1, 3 * max_bytes), seed=seed)
    check_bounded(text, max_bytes, f"tr_{seed:032x}")


TRACEBACK = (
    "\nTraceback (most recent call last):\n"
    '  File "/srv/app/main.py", line 42, in <module>\n'
    "    run()\n"
    '  File "/srv/app/main.py", line 17, in run\n'
    '    raise ValueError("配置无效 😱")\n'
    "ValueError: 配置无效 😱\n"
)


def test_a_result_ending_in_an_error_keeps_more_tail_than_head() -> None:
    text = mixed_text(100_000, seed=4) + TRACEBACK
    head, tail = check_bounded(text, LIMIT, "tr_err")
    assert tail > 2 * head
    bounded = bound_tool_content(text, LIMIT, "tr_err")
    assert bounded.content.endswith(TRACEBACK)


def test_a_result_without_an_error_keeps_more_head_than_tail() -> None:
    text = mixed_text(100_000, seed=4)
    head, tail = check_bounded(text, LIMIT, "tr_ok")
    assert head > 2 * tail


@pytest.mark.parametrize("ending", ["\nerror: linker command failed", "\nmake: *** Error 2", "\nexit code 1"])
def test_other_error_endings_also_keep_more_tail(ending: str) -> None:
    head, tail = check_bounded(mixed_text(80_000, seed=5) + ending, LIMIT, "tr_e")
    assert tail > head


# ---- read_page ---------------------------------------------------------------------------------


def whole(raw: bytes) -> RawSpan:
    return RawSpan(0, raw, len(raw))


def domain_error(raw: bytes, offset: int, limit: int) -> DomainError:
    with pytest.raises(DomainError) as caught:
        read_page(whole(raw), offset, limit)
    assert caught.value.kind is Kind.INVALID_ARGUMENT
    return caught.value


def test_read_page_snaps_the_end_back_to_a_char_boundary() -> None:
    raw = ("a" + "😀" * 3 + "汉").encode()  # 1 + 12 + 3 bytes
    page = read_page(whole(raw), 0, 4)
    assert (page.data, page.offset, page.next_offset, page.complete) == ("a", 0, 1, False)
    page = read_page(whole(raw), 1, 7)
    assert (page.data, page.next_offset) == ("😀", 5)
    page = read_page(whole(raw), 5, 8)
    assert (page.data, page.next_offset) == ("😀😀", 13)
    page = read_page(whole(raw), 13, 4)
    assert (page.data, page.next_offset, page.total_bytes, page.complete) == ("汉", 16, 16, True)
    page = read_page(whole(raw), 16, 4)  # reading at the very end is an empty, complete page
    assert (page.data, page.next_offset, page.complete) == ("", 16, True)


def test_read_page_limit_zero_means_the_default() -> None:
    raw = b"x" * (DEFAULT_PAGE_BYTES * 2)
    page = read_page(whole(raw), 0, 0)
    assert page.next_offset == DEFAULT_PAGE_BYTES
    page = read_page(whole(raw), 0, MAX_PAGE_BYTES)
    assert page.next_offset == MAX_PAGE_BYTES


@pytest.mark.parametrize("limit", [4, 5, 6, 7, 11, 4096, MAX_PAGE_BYTES])
def test_read_page_pages_concatenate_to_the_original(limit: int) -> None:
    raw = mixed_text(60_000, seed=limit).encode()
    offset, chunks = 0, []
    while True:
        page = read_page(whole(raw), offset, limit)
        assert page.offset == offset
        assert page.total_bytes == len(raw)
        size = page.next_offset - offset
        assert len(page.data.encode()) == size <= limit
        if page.complete:
            assert page.next_offset == len(raw)
            chunks.append(page.data)
            break
        assert size > limit - 4  # snapping back loses at most three bytes
        chunks.append(page.data)
        offset = page.next_offset
    assert "".join(chunks).encode() == raw


@pytest.mark.parametrize("limit", [4, 5, 7, 4096, MAX_PAGE_BYTES])
def test_a_page_cut_from_its_span_equals_the_page_cut_from_the_whole_result(limit: int) -> None:
    raw = mixed_text(40_000, seed=limit).encode()
    for offset in range(0, len(raw) + 1, 997):
        start, stop = page_span(offset, limit, len(raw))
        assert stop - start <= limit + 4
        span = RawSpan(start, raw[start:stop], len(raw))
        try:
            expected = read_page(whole(raw), offset, limit)
        except DomainError as error:
            with pytest.raises(DomainError) as caught:
                read_page(span, offset, limit)
            assert (caught.value.reason, caught.value.metadata) == (error.reason, error.metadata)
        else:
            assert read_page(span, offset, limit) == expected


def test_read_page_refuses_a_span_that_misses_the_pages_bytes() -> None:
    raw = b"x" * 100
    with pytest.raises(ValueError, match="does not cover"):
        read_page(RawSpan(10, raw[10:30], len(raw)), 10, 20)


@pytest.mark.parametrize("limit", [-1, 1, 3, MAX_PAGE_BYTES + 1, 1 << 40])
def test_read_page_rejects_limits_out_of_range(limit: int) -> None:
    assert domain_error(b"hello", 0, limit).reason == "LIMIT_OUT_OF_RANGE"


@pytest.mark.parametrize("offset", [-1, 6, 1 << 40])
def test_read_page_rejects_offsets_outside_the_result(offset: int) -> None:
    error = domain_error(b"hello", offset, 0)
    assert error.reason == "OFFSET_OUT_OF_RANGE"
    assert error.metadata["total_bytes"] == "5"


@pytest.mark.parametrize(("offset", "char_start"), [(2, 1), (3, 1), (4, 1), (6, 5), (7, 5)])
def test_read_page_rejects_offsets_inside_a_character(offset: int, char_start: int) -> None:
    raw = ("a" + "😀" + "汉").encode()  # 😀 = bytes 1..4, 汉 = bytes 5..7
    error = domain_error(raw, offset, 4)
    assert error.reason == "OFFSET_NOT_CHAR_BOUNDARY"
    assert error.metadata["char_start"] == str(char_start)


# ---- through the server ------------------------------------------------------------------------


async def append_result(stub: pb_grpc.ContextServiceStub, session_id: str, call_id: str, content: str) -> pb.Message:
    """Appends a call and its result; returns the stored result message."""
    response = await append(
        stub, session_id, call(call_id, "read_file", '{"path": "日志.txt"}'), result(call_id, content)
    )
    stored = response.messages[1]
    assert stored.role == pb.ROLE_TOOL
    assert stored.tool_call_id == call_id
    assert stored.result_ref.startswith("tr_")
    return stored


async def read(
    stub: pb_grpc.ContextServiceStub, session_id: str, ref: str, offset: int = 0, limit: int = 0
) -> pb.ReadToolResultResponse:
    return await stub.ReadToolResult(
        pb.ReadToolResultRequest(session_id=session_id, result_ref=ref, offset=offset, limit=limit)
    )


async def read_all(stub: pb_grpc.ContextServiceStub, session_id: str, ref: str, raw: bytes, limit: int) -> int:
    """Pages through a whole result, checking every page; returns the number of pages."""
    effective = limit or DEFAULT_PAGE_BYTES
    digest = hashlib.sha256(raw).hexdigest()
    offset, chunks, pages = 0, [], 0
    while True:
        page = await read(stub, session_id, ref, offset, limit)
        pages += 1
        assert page.offset == offset
        assert page.total_bytes == len(raw)
        assert page.sha256 == digest
        assert page.result_ref == ref
        data = page.data.encode()
        assert len(data) == page.next_offset - offset <= effective
        assert data == raw[offset : page.next_offset]
        chunks.append(data)
        if page.complete:
            assert page.next_offset == len(raw)
            break
        assert page.next_offset < len(raw)
        assert len(data) > effective - 4
        offset = page.next_offset
    assert b"".join(chunks) == raw
    return pages


@pytest.mark.parametrize("n_chars", [50, 20_000])
async def test_a_binary_tool_result_is_accepted_pictured_in_the_view_and_read_back_byte_for_byte(
    stub: pb_grpc.ContextServiceStub, n_chars: int
) -> None:
    session_id = (await create_session(stub)).id
    text = binary_text(n_chars, seed=n_chars)
    stored = await append_result(stub, session_id, "call_cat", text)
    assert "\x00" not in stored.content and "\u2400" in stored.content
    assert stored.raw_bytes == len(text.encode())
    view = (await prepare(stub, session_id)).result
    assert stored.content in [m.content for m in view.messages]
    await read_all(stub, session_id, stored.result_ref, text.encode(), MAX_PAGE_BYTES)


async def test_a_200k_result_is_bounded_and_pages_back_exactly(stub: pb_grpc.ContextServiceStub) -> None:
    session_id = (await create_session(stub)).id
    text = mixed_text(200 * 1024, seed=11) + "\n完成 ✅ done"
    raw = text.encode()
    await stub.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=session_id, messages=[pb.Message(role=pb.ROLE_USER, content="读一下日志 📜")]
        )
    )
    stored = await append_result(stub, session_id, "call_big", text)
    ref = stored.result_ref
    assert stored.truncated
    assert stored.raw_bytes == len(raw)
    assert len(stored.content.encode()) <= LIMIT
    match = MARKER.search(stored.content)
    assert match is not None
    assert (match["ref"], int(match["original"])) == (ref, len(raw))
    assert stored.content.startswith(text[:200])
    assert stored.content.endswith(text[-200:])

    # The transcript holds the bounded content, not the raw result.
    listed = await stub.ListMessages(pb.ListMessagesRequest(session_id=session_id))
    assert [m.seq for m in listed.messages] == [1, 2, 3]
    assert listed.messages[2] == stored

    assert await read_all(stub, session_id, ref, raw, 0) == -(-len(raw) // DEFAULT_PAGE_BYTES)
    assert await read_all(stub, session_id, ref, raw, MAX_PAGE_BYTES) >= len(raw) // MAX_PAGE_BYTES
    await read_all(stub, session_id, ref, raw, 10_000)

    # By tool_call_id when it is unique: the same result.
    by_call = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session_id, tool_call_id="call_big"))
    assert by_call.result_ref == ref
    assert by_call.data.encode() == raw[: by_call.next_offset]


@pytest.mark.parametrize("limit", [4, 5, 7])
async def test_tiny_pages_chain_through_a_large_result(stub: pb_grpc.ContextServiceStub, limit: int) -> None:
    """Tiny pages across the start, the middle and the end of a 200 KiB result (paging all of it 4
    bytes at a time would take 50,000 calls)."""
    session_id = (await create_session(stub)).id
    raw = mixed_text(200 * 1024, seed=limit).encode()
    ref = (await append_result(stub, session_id, "call_1", raw.decode())).result_ref
    middle = len(raw) // 2
    while raw[middle] & 0xC0 == 0x80:
        middle += 1
    end_window = len(raw) - 60
    while raw[end_window] & 0xC0 == 0x80:
        end_window += 1
    for start in (0, middle, end_window):
        offset = start
        for _ in range(25):
            page = await read(stub, session_id, ref, offset, limit)
            data = page.data.encode()
            assert 0 < len(data) <= limit
            assert data == raw[offset : page.next_offset]
            assert page.complete == (page.next_offset == len(raw))
            offset = page.next_offset
            if page.complete:
                break
        if start == end_window:
            assert offset == len(raw)


@pytest.mark.parametrize("limit", [4, 5, 7])
async def test_tiny_pages_read_a_whole_small_result(stub: pb_grpc.ContextServiceStub, limit: int) -> None:
    session_id = (await create_session(stub)).id
    raw = ("结果 😀 ok, " + mixed_text(300, seed=limit) + " 尾🎉").encode()
    stored = await append_result(stub, session_id, "call_1", raw.decode())
    assert not stored.truncated
    assert stored.content.encode() == raw
    await read_all(stub, session_id, stored.result_ref, raw, limit)


@pytest.mark.parametrize("max_bytes", [0, 4096], ids=["default-32768", "4096"])
@pytest.mark.parametrize("delta", [-1, 0, 1, 2, 3], ids=lambda d: f"limit{d:+d}")
async def test_results_around_the_limit_round_trip(
    stub: pb_grpc.ContextServiceStub, max_bytes: int, delta: int
) -> None:
    session_id = (await create_session(stub, tool_content_max_bytes=max_bytes)).id
    limit = max_bytes or LIMIT
    text = mixed_text(limit + delta, seed=limit + delta)
    raw = text.encode()
    stored = await append_result(stub, session_id, "call_1", text)
    assert stored.raw_bytes == len(raw)
    assert stored.truncated == (delta > 0)
    if delta <= 0:
        assert stored.content == text
    else:
        assert len(stored.content.encode()) <= limit
        assert f"result_ref={stored.result_ref}" in stored.content
    for page_limit in (0, MAX_PAGE_BYTES, 1000):
        await read_all(stub, session_id, stored.result_ref, raw, page_limit)


async def test_pure_chinese_and_emoji_results_round_trip(stub: pb_grpc.ContextServiceStub) -> None:
    session_id = (await create_session(stub)).id
    for call_id, text in [("c1", repeat_to("汉", 3 * 20000)), ("c2", repeat_to("😀", 4 * 15000))]:
        stored = await append_result(stub, session_id, call_id, text)
        assert stored.truncated
        await read_all(stub, session_id, stored.result_ref, text.encode(), 0)
        await read_all(stub, session_id, stored.result_ref, text.encode(), 1001)


async def test_unknown_result_ref_is_not_found(stub: pb_grpc.ContextServiceStub) -> None:
    session_id = (await create_session(stub)).id
    await append_result(stub, session_id, "call_1", "ok")
    await expect_error(
        read(stub, session_id, "tr_doesnotexist"),
        grpc.StatusCode.NOT_FOUND,
        "RESULT_REF_NOT_FOUND",
        {"result_ref": "tr_doesnotexist"},
    )


async def test_unknown_tool_call_id_is_not_found(stub: pb_grpc.ContextServiceStub) -> None:
    session_id = (await create_session(stub)).id
    await append_result(stub, session_id, "call_1", "ok")
    await expect_error(
        stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session_id, tool_call_id="call_2")),
        grpc.StatusCode.NOT_FOUND,
        "TOOL_CALL_NOT_FOUND",
    )


async def test_a_result_needs_a_ref_or_a_tool_call_id(stub: pb_grpc.ContextServiceStub) -> None:
    session_id = (await create_session(stub)).id
    await expect_error(
        stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session_id)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "RESULT_REF_REQUIRED",
    )


async def test_a_reused_tool_call_id_is_ambiguous_without_a_ref(stub: pb_grpc.ContextServiceStub) -> None:
    session_id = (await create_session(stub)).id
    first = await append_result(stub, session_id, "call_1", "第一次 🥇")
    second = await append_result(stub, session_id, "call_1", "第二次 🥈")
    assert first.result_ref != second.result_ref
    info = await expect_error(
        stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session_id, tool_call_id="call_1")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "RESULT_REF_AMBIGUOUS",
        {"tool_call_id": "call_1"},
    )
    assert info.metadata["candidates"].split(",") == [first.result_ref, second.result_ref]
    # Named by ref, each reads back its own result.
    assert (await read(stub, session_id, first.result_ref)).data == "第一次 🥇"
    assert (await read(stub, session_id, second.result_ref)).data == "第二次 🥈"
    # The ref decides when both are given.
    both = await stub.ReadToolResult(
        pb.ReadToolResultRequest(session_id=session_id, tool_call_id="call_1", result_ref=second.result_ref)
    )
    assert both.data == "第二次 🥈"


async def test_another_sessions_result_is_not_found(stub: pb_grpc.ContextServiceStub) -> None:
    owner = (await create_session(stub)).id
    other = (await create_session(stub)).id
    text = mixed_text(50_000, seed=9)
    stored = await append_result(stub, owner, "call_1", text)
    small = await append_result(stub, owner, "call_2", "small 小")
    await append_result(stub, other, "call_1", "mine")
    for ref in (stored.result_ref, small.result_ref):
        await expect_error(
            read(stub, other, ref), grpc.StatusCode.NOT_FOUND, "RESULT_REF_NOT_FOUND", {"result_ref": ref}
        )
    # The other session's tool_call_id lookup sees only its own result.
    mine = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=other, tool_call_id="call_1"))
    assert mine.data == "mine"
    # The owner still reads it.
    assert (await read(stub, owner, stored.result_ref)).total_bytes == len(text.encode())


async def test_reading_in_an_unknown_session_is_not_found(stub: pb_grpc.ContextServiceStub) -> None:
    await expect_error(
        read(stub, "s_missing", "tr_x"),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
        {"session_id": "s_missing"},
    )


@pytest.mark.parametrize(
    ("offset", "limit", "reason"),
    [
        (1, 0, "OFFSET_NOT_CHAR_BOUNDARY"),  # inside 结 (bytes 0..2)
        (2, 0, "OFFSET_NOT_CHAR_BOUNDARY"),
        (-1, 0, "OFFSET_OUT_OF_RANGE"),
        (10_000, 0, "OFFSET_OUT_OF_RANGE"),
        (0, 3, "LIMIT_OUT_OF_RANGE"),
        (0, -5, "LIMIT_OUT_OF_RANGE"),
        (0, MAX_PAGE_BYTES + 1, "LIMIT_OUT_OF_RANGE"),
    ],
)
async def test_bad_offsets_and_limits_are_invalid(
    stub: pb_grpc.ContextServiceStub, offset: int, limit: int, reason: str
) -> None:
    session_id = (await create_session(stub)).id
    stored = await append_result(stub, session_id, "call_1", "结果 😀 ok")
    await expect_error(
        read(stub, session_id, stored.result_ref, offset, limit), grpc.StatusCode.INVALID_ARGUMENT, reason
    )
    # Valid reads still work afterwards.
    assert (await read(stub, session_id, stored.result_ref)).data == "结果 😀 ok"


# ---- chunked storage: a page read costs O(page) --------------------------------------------------


def chunk_text(n_bytes: int) -> str:
    """`n_bytes` of mixed UTF-8 built from one odd-sized block, so chunk boundaries (every 64 KiB)
    fall inside characters of every width."""
    block = mixed_text(100_003, seed=42)
    text = block * (n_bytes // len(block.encode())) + "x" * (n_bytes % len(block.encode()))
    assert len(text.encode()) == n_bytes
    return text


async def test_a_multi_mib_result_pages_back_exactly_with_its_sha256(stub: pb_grpc.ContextServiceStub) -> None:
    session_id = (await create_session(stub)).id
    raw = chunk_text(3 * (1 << 20) + 12_345).encode()
    stored = await append_result(stub, session_id, "call_big", raw.decode())
    assert stored.truncated
    pages = await read_all(stub, session_id, stored.result_ref, raw, MAX_PAGE_BYTES)
    assert pages >= len(raw) // MAX_PAGE_BYTES
    # A fork shares the chunks (nothing is copied) and pages them the same way.
    fork = (await stub.Fork(pb.ForkRequest(session_id=session_id))).session
    await read_all(stub, fork.id, stored.result_ref, raw, MAX_PAGE_BYTES)


async def test_a_page_read_fetches_only_the_chunks_it_covers(
    server: RunningServer, stub: pb_grpc.ContextServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id = (await create_session(stub)).id
    raw = chunk_text(8 << 20).encode()
    ref = (await append_result(stub, session_id, "call_big", raw.decode())).result_ref
    fetched: list[tuple[int, int]] = []
    fetch = server.store._fetch_chunks

    async def counting(conn: AsyncConnection, ref: str, first: int, last: int) -> list[bytes]:
        fetched.append((first, last))
        return await fetch(conn, ref, first, last)

    monkeypatch.setattr(server.store, "_fetch_chunks", counting)
    # Offsets at the start, across a chunk boundary, deep inside and at the very end.
    starts = [0, 5 * CHUNK_BYTES - 100, len(raw) // 2, len(raw) - 10, len(raw)]
    for start in starts:
        offset = start
        while offset < len(raw) and raw[offset] & 0xC0 == 0x80:
            offset -= 1
        page = await read(stub, session_id, ref, offset, MAX_PAGE_BYTES)
        assert page.data.encode() == raw[offset : page.next_offset]
        assert page.sha256 == hashlib.sha256(raw).hexdigest()
        # Only the chunks covering the page's bytes (with 3 bytes before it and 1 after) are read.
        lo, hi = max(offset - 3, 0), min(offset + MAX_PAGE_BYTES + 1, len(raw))
        assert fetched[-1] == (lo // CHUNK_BYTES, (hi - 1) // CHUNK_BYTES)
    assert len(fetched) == len(starts)
    assert all(last - first <= 1 for first, last in fetched), fetched
    assert fetched[1][1] - fetched[1][0] == 1  # the page across a boundary reads both chunks


async def test_a_result_stored_before_migration_0003_stays_readable(backend: str, tmp_path: Path) -> None:
    url = await fresh_database(backend, tmp_path)
    raw = chunk_text(200_001).encode()
    running = await start_server(settings_for(url))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ContextServiceStub(channel)
            session_id = (await create_session(stub)).id
            ref = (await append_result(stub, session_id, "call_old", raw.decode())).result_ref
    finally:
        await running.stop(grace=0.5)
    # Make the database what migration 0002 left: the result as one zstd frame in `data`, no chunks.
    tr = schema.tool_results
    # Every column migration 0002 has.
    columns = [tr.c.ref, tr.c.segment_id, tr.c.message_id, tr.c.codec, tr.c.data, tr.c.total_bytes, tr.c.sha256]
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(delete(schema.tool_result_chunks))
            await conn.execute(
                update(tr).where(tr.c.ref == ref).values(codec="zstd", data=zstandard.ZstdCompressor().compress(raw))
            )
            await conn.run_sync(downgrade, "0002")
            before = (await conn.execute(select(*columns).order_by(tr.c.ref))).all()
    finally:
        await engine.dispose()

    running = await start_server(settings_for(url))  # migrates to the newest revision
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            await read_all(pb_grpc.ContextServiceStub(channel), session_id, ref, raw, MAX_PAGE_BYTES)
        async with running.store.engine.connect() as conn:
            after = (await conn.execute(select(*columns).order_by(tr.c.ref))).all()
            chunk_bytes = (await conn.execute(select(tr.c.chunk_bytes).where(tr.c.ref == ref))).scalar_one()
        # Migration 0006 rewrote the frame as chunks (see test_result_pages.py); the rest is untouched.
        kept = [(r.ref, r.segment_id, r.message_id, r.total_bytes, r.sha256) for r in after]
        assert kept == [(r.ref, r.segment_id, r.message_id, r.total_bytes, r.sha256) for r in before]
        assert [r.codec for r in after] == ["zstd_chunks"] and chunk_bytes == CHUNK_BYTES
    finally:
        await running.stop(grace=0.5)
