"""The provider prompt-cache simulator and price sheets on hand-computed cases."""

from __future__ import annotations

import json
from array import array

import pytest

from ctxfold.engine import estimator
from ctxfold.engine.model import ToolCall
from ctxfold.replay.metrics import (
    SUMMARY_FIRST_TOKEN_SECONDS,
    SUMMARY_TOKENS_PER_SECOND,
    ModelCall,
    Recording,
    SummaryCall,
    bill,
    ideal_hit_ratio,
)
from ctxfold.replay.prices import BUILT_IN, PriceError, PriceSheet, sheet_from_mapping
from ctxfold.replay.simulator import (
    END,
    START,
    BlockCache,
    BreakpointCache,
    Provider,
    answer_tokens,
    cache_model,
    message_tokens,
    render,
)
from ctxfold.replay.trace import Msg, Trace, TraceError, parse_trace, turns


def seq(start: int, length: int) -> array[int]:
    """`length` distinct tokens starting at `start` (different starts never share a first token)."""
    return array("I", range(start, start + length))


def prefixed(base: array[int], shared: int, extra: int, fresh: int = 900_000) -> array[int]:
    """The first `shared` tokens of `base`, then `extra` tokens that match nothing."""
    return base[:shared] + seq(fresh, extra)


# ---- DeepSeek: 64-token blocks ---------------------------------------------------------------------


def test_deepseek_hits_whole_64_token_blocks_of_the_shared_prefix() -> None:
    cache = BlockCache("deepseek", block=64, minimum=64)
    a = seq(0, 200)
    first = cache.request("k", a, 0)
    assert (first.input_tokens, first.hit, first.miss) == (200, 0, 200)
    # 150 shared tokens = 2 whole blocks (128); the rest is a miss.
    b = prefixed(a, 150, 100)
    second = cache.request("k", b, 1)
    assert (second.input_tokens, second.hit, second.miss) == (250, 128, 122)
    # The same 200 tokens again: 3 whole blocks (192); the last 8 tokens never fill a block.
    third = cache.request("k", a, 2)
    assert (third.hit, third.miss) == (192, 8)
    # Below one block nothing is cached.
    assert cache.request("k", prefixed(a, 63, 10), 3).hit == 0


def test_a_request_hits_its_longest_prefix_shared_with_any_earlier_request() -> None:
    cache = BlockCache("deepseek", block=64, minimum=64)
    a = seq(0, 640)
    cache.request("k", a, 0)
    cache.request("k", seq(10_000, 640), 1)  # unrelated, in between
    c = prefixed(a, 400, 50)
    assert cache.request("k", c, 2).hit == 384  # 6 blocks of A
    # C extended: its own 400 + 50 tokens are now cached too (7 blocks of 64 = 448 of 450 + 10).
    assert cache.request("k", c + seq(800_000, 10), 3).hit == 448


def test_cache_keys_do_not_share_entries() -> None:
    cache = BlockCache("deepseek", block=64, minimum=64)
    a = seq(0, 256)
    cache.request("agent", a, 0)
    assert cache.request("condenser", a, 1).hit == 0
    assert cache.request("agent", a, 2).hit == 256


# ---- OpenAI: 1024 minimum, then 128-token steps ----------------------------------------------------


@pytest.mark.parametrize(("shared", "hit"), [(1000, 0), (1023, 0), (1024, 1024), (1100, 1024), (1300, 1280)])
def test_openai_needs_1024_shared_tokens_then_counts_in_steps_of_128(shared: int, hit: int) -> None:
    cache = cache_model("openai")
    a = seq(0, 2000)
    cache.request("k", a, 0)
    result = cache.request("k", prefixed(a, shared, 500), 1)
    assert (result.hit, result.miss) == (hit, shared + 500 - hit)


def test_openai_full_repeat_rounds_down_to_the_last_128_step() -> None:
    cache = cache_model("openai")
    a = seq(0, 2000)
    cache.request("k", a, 0)
    assert cache.request("k", a + seq(900_000, 100), 1).hit == 1920  # 15 × 128


# ---- TTL --------------------------------------------------------------------------------------------


def test_block_cache_entries_expire_after_the_ttl_and_hits_refresh_them() -> None:
    cache = BlockCache("openai", block=128, minimum=1024, ttl=300)
    a = seq(0, 2048)
    cache.request("k", a, 0)
    assert cache.request("k", a, 200).hit == 2048  # used at 200: alive until 500
    assert cache.request("k", a, 450).hit == 2048  # refreshed at 200, so alive at 450
    assert cache.request("k", a, 751).hit == 0  # last used at 450: gone after 750


def test_deepseek_default_keeps_the_cache_for_the_whole_replay() -> None:
    cache = cache_model("deepseek")
    a = seq(0, 640)
    cache.request("k", a, 0)
    assert cache.request("k", a, 10_000_000).hit == 640


# ---- Anthropic: explicit breakpoints -----------------------------------------------------------------


def test_anthropic_writes_each_request_at_its_breakpoint_and_reads_earlier_breakpoint_prefixes() -> None:
    cache = BreakpointCache(minimum=1024, ttl=300)
    a = seq(0, 1500)
    first = cache.request("k", a, 0)
    assert (first.hit, first.write, first.miss) == (0, 1500, 0)
    b = a + seq(100_000, 500)
    second = cache.request("k", b, 10)
    assert (second.hit, second.write, second.miss) == (1500, 500, 0)
    # Shares 1200 tokens with A and B, but no earlier breakpoint prefix (1500, 2000) is a prefix of it.
    c = prefixed(a, 1200, 600)
    third = cache.request("k", c, 20)
    assert (third.hit, third.write, third.miss) == (0, 1800, 0)
    # B extended reads B (the longest breakpoint prefix), not A.
    assert cache.request("k", b + seq(200_000, 10), 30).hit == 2000
    # Shorter than the 1024-token minimum: read nothing, write nothing, pay plain input.
    short = cache.request("k", seq(300_000, 1000), 40)
    assert (short.hit, short.write, short.miss) == (0, 0, 1000)


def test_anthropic_five_minute_ttl_is_refreshed_by_reads() -> None:
    cache = BreakpointCache(minimum=1024, ttl=300)
    a = seq(0, 1500)
    cache.request("k", a, 0)
    assert cache.request("k", prefixed(a, 1500, 10, 500_000), 200).hit == 1500  # read at 200 refreshes A
    assert cache.request("k", prefixed(a, 1500, 10, 600_000), 450).hit == 1500  # 250 s after that read
    # Nothing read A after 450: at 751 it has expired; so have the entries written at 200 and 450.
    late = cache.request("k", prefixed(a, 1500, 10, 700_000), 751)
    assert (late.hit, late.write) == (0, 1510)


# ---- rendering ----------------------------------------------------------------------------------------


def test_messages_render_to_the_same_tokens_every_time_with_four_framing_tokens() -> None:
    hello = Msg("user", "hello")
    tokens = message_tokens(hello)
    assert tokens[0] == START and tokens[-1] == END
    assert len(tokens) == estimator.count_text("hello") + estimator.PER_MESSAGE_TOKENS
    assert message_tokens(Msg("user", "hello", source=7)) == tokens  # where it came from does not matter
    call = Msg("assistant", "", tool_calls=(ToolCall("c1", "bash", '{"cmd":"ls"}'),))
    assert len(message_tokens(call)) == 4 + estimator.count_text("bash") + estimator.count_text('{"cmd":"ls"}') + 3


def test_a_longer_conversation_renders_to_an_extension_of_the_shorter_one() -> None:
    tools = json.dumps([{"type": "function", "function": {"name": "bash"}}])
    system, user, answer = Msg("system", "Be brief."), Msg("user", "List files."), Msg("assistant", "Here.")
    short = render(tools, [system, user])
    long = render(tools, [system, user, answer, Msg("user", "Thanks.")])
    # The reply priming (START assistant \n) that ends a request is how the answer message starts.
    assert long[: len(short)] == short


def test_ideal_hit_ratio_counts_everything_but_what_is_new_to_the_conversation() -> None:
    trace = Trace(
        "t",
        "",
        "[]",
        (Msg("user", "hello", source=0), Msg("assistant", "world", source=1), Msg("user", "again", source=2)),
    )
    trace = Trace("t", "", "[]", (*trace.messages, Msg("assistant", "done", source=3)))
    # Request 1: [hello] = 1 + 4 framing + 3 priming = 8 tokens, all new.
    # Request 2: [hello, world, again] = 3 × 5 + 3 = 18 tokens, 8 of them already sent.
    assert ideal_hit_ratio(trace) == pytest.approx(8 / (8 + 18))


# ---- prices and billing -------------------------------------------------------------------------------


def test_price_sheets_bill_hits_misses_writes_and_output() -> None:
    deepseek = BUILT_IN["deepseek-chat"]
    # 1M hits × $0.028 + 0.5M misses × $0.28 + 0.1M output × $0.42
    assert deepseek.cost(hit=1_000_000, miss=500_000, write=0, output=100_000) == pytest.approx(0.21)
    sonnet = BUILT_IN["claude-sonnet-4.5"]
    # 1M reads × $0.30 + 1M writes × $3.75 + 0.1M output × $15
    assert sonnet.cost(hit=1_000_000, miss=0, write=1_000_000, output=100_000) == pytest.approx(5.55)
    gpt5 = BUILT_IN["gpt-5"]
    assert gpt5.cost(hit=2_000_000, miss=1_000_000, write=0, output=0) == pytest.approx(0.25 + 1.25)
    for sheet in BUILT_IN.values():
        assert "as published" in sheet.source and sheet.input_hit < sheet.input_miss


def test_custom_price_sheets_are_validated() -> None:
    sheet = sheet_from_mapping({"provider": "openai", "input_miss": 1.0, "input_hit": 0.1, "output": 4}, "mine")
    assert sheet == PriceSheet("mine", "openai", 1.0, 0.1, 1.0, 4.0, "custom sheet mine")
    with pytest.raises(PriceError, match="unknown field"):
        sheet_from_mapping({"input": 1.0})
    with pytest.raises(PriceError, match=">= 0"):
        sheet_from_mapping({"output": -1})
    with pytest.raises(PriceError, match="provider"):
        sheet_from_mapping({"provider": "acme"})


def test_provider_bills_a_conversation_turn_by_turn() -> None:
    provider = Provider(cache_model("deepseek"), BUILT_IN["deepseek-chat"])
    system = Msg("system", "word " * 200)  # 200+ tokens: some whole blocks
    user = Msg("user", "please " * 100)
    first = provider.send("k", "", [system, user], output_tokens=10)
    assert first.cache.hit == 0 and first.cache.miss == first.cache.input_tokens
    provider.advance(10)
    answer = Msg("assistant", "ok")
    second = provider.send("k", "", [system, user, answer, Msg("user", "more")], output_tokens=5)
    assert second.cache.hit == first.cache.input_tokens // 64 * 64
    expected = BUILT_IN["deepseek-chat"].cost(second.cache.hit, second.cache.miss, 0, 5)
    assert second.cost == pytest.approx(expected)
    assert answer_tokens(Msg("assistant", "hi", tool_calls=(ToolCall("c", "bash", "ls"),))) == 3


def test_bill_keeps_hits_plus_misses_equal_to_billed_input() -> None:
    messages = tuple(Msg("user" if i % 2 == 0 else "assistant", f"message {i} " * 50, source=i) for i in range(8))
    trace = Trace("t", "system prompt", "[]", messages)
    calls, _ = turns(trace)
    history: list[Msg] = [Msg("system", "system prompt")]
    recorded = []
    for turn in calls:
        history += turn.append
        recorded.append(ModelCall(tuple(history), turn.answer))
    for name in ("deepseek", "openai", "anthropic"):
        sheet = next(s for s in BUILT_IN.values() if s.provider == name)
        result = bill(trace, Recording("full", {}, tuple(recorded), 7), Provider(cache_model(name), sheet))
        assert result.turns == 4
        assert result.cache_hit_tokens + result.cache_miss_tokens == result.input_tokens
        assert result.total_cost == pytest.approx(result.series_cumulative_cost[-1])


def test_the_agent_waits_for_the_summaries_of_its_calls_but_not_for_those_made_in_the_background() -> None:
    messages = tuple(Msg("user" if i % 2 == 0 else "assistant", f"message {i} " * 50, source=i) for i in range(6))
    trace = Trace("t", "system prompt", "[]", messages)
    calls, _ = turns(trace)
    summary = (Msg("user", "summarize"),)
    waited = SummaryCall("agent", summary, 300)
    behind = SummaryCall("agent", summary, 300, background=True)
    recorded = (
        ModelCall((calls[0].append[0],), calls[0].answer, summary_calls=(waited, SummaryCall("agent", (), 0))),
        ModelCall((calls[1].append[0],), calls[1].answer, summary_calls=(behind,)),
        ModelCall((calls[2].append[0],), calls[2].answer, summary_calls=(waited,)),
    )
    sheet = BUILT_IN["gpt-5"]
    result = bill(trace, Recording("p", {}, recorded, 5), Provider(cache_model(sheet.provider), sheet))
    one = SUMMARY_FIRST_TOKEN_SECONDS + 300 / SUMMARY_TOKENS_PER_SECOND
    assert result.summary_wait_max_seconds == pytest.approx(one + SUMMARY_FIRST_TOKEN_SECONDS)  # two passes
    assert result.summary_wait_seconds == pytest.approx(2 * one + SUMMARY_FIRST_TOKEN_SECONDS)
    assert result.summarizer_calls == 4  # the background one is paid for all the same


# ---- traces ------------------------------------------------------------------------------------------


def test_traces_parse_from_chat_json_and_jsonl_and_split_into_model_calls() -> None:
    document = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "task"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [{"type": "function", "function": {"name": "ls"}}],
    }
    from_json = parse_trace("t.json", json.dumps(document))
    lines = [json.dumps({"tools": document["tools"]})] + [json.dumps(m) for m in document["messages"]]
    from_jsonl = parse_trace("t.jsonl", "\n".join(lines) + "\n")
    for trace in (from_json, from_jsonl):
        assert trace.system_prompt == "sys" and json.loads(trace.tools_json) == document["tools"]
        assert [m.source for m in trace.messages] == [0, 1, 2, 3, 4]
        calls, trailing = turns(trace)
        assert [[m.source for m in c.append] for c in calls] == [[0], [1, 2]]
        assert [c.answer.content for c in calls] == ["", "done"]
        assert [m.source for m in trailing] == [3, 4]
    with pytest.raises(TraceError, match="unknown role"):
        parse_trace("bad.jsonl", '{"role": "robot", "content": "x"}\n')
    with pytest.raises(TraceError, match="no assistant"):
        parse_trace("bad.json", json.dumps({"messages": [{"role": "user", "content": "x"}]}))
    with pytest.raises(TraceError, match=r"^bad\.json: no assistant"):  # valid JSON, not said to be invalid
        parse_trace("bad.json", json.dumps([{"role": "user", "content": "x"}]))
