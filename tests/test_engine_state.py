"""Context state v3 and cache state: pure functions, tested directly."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ctxfold.engine.answer import Answering, answer
from ctxfold.engine.cache import COLD, OBSERVED_CACHE_TTL_SECONDS, UNKNOWN, WARM, cache_state, cache_ttl_seconds
from ctxfold.engine.errors import DomainError
from ctxfold.engine.maintenance import Action
from ctxfold.engine.model import SessionConfig, Usage
from ctxfold.engine.projection import Projection
from ctxfold.engine.state import (
    CALIBRATION_SMOOTHING,
    MAX_VIEWS,
    ContextState,
    Receipt,
    ReceiptAction,
    ReceiptStatus,
    ViewRecord,
    carried_over,
    check_usage,
    fingerprint,
    first_generation,
    load_state,
    observed,
    split_view_version,
    view_version,
)

FP = fingerprint("g_1", "cp_1")


def stored() -> ContextState:
    state = ContextState(fingerprint=FP, generation=4, pruned={"m_1": 120}, calibration=1.2)
    state = state.with_receipt(Receipt("op", ReceiptStatus.APPLIED, ReceiptAction.SUMMARY, 9000, 4000, "pass 1", 1.0))
    return replace(state, views=state.views_with(ViewRecord(view_version(4, 12), 8000)))


def test_a_valid_state_round_trips() -> None:
    state, why = load_state(stored().to_json(), FP)
    assert why == "" and state == stored()
    document = json.loads(stored().to_json())
    assert document["schema_version"] == 3
    assert document["last_receipt"]["tokens_saved"] == 5000


def test_legacy_and_unknown_fields_are_read_and_ignored() -> None:
    document = json.loads(stored().to_json()) | {"soft_compact_ratio": 0.6, "native_compaction": {"x": 1}}
    state, why = load_state(json.dumps(document), FP)
    assert why == "" and state == stored()


def test_receipts_read_back_as_their_status_and_action_and_unknown_ones_are_left_out() -> None:
    document = json.loads(stored().to_json())
    assert document["receipts"][0]["status"] == "applied" and document["receipts"][0]["action"] == "summary"
    newer = {**document["receipts"][0], "operation_id": "op2", "status": "deferred"}
    state, why = load_state(json.dumps(document | {"receipts": [*document["receipts"], newer]}), FP)
    assert why == ""
    (receipt,) = state.receipts
    assert receipt.status is ReceiptStatus.APPLIED and receipt.action is ReceiptAction.SUMMARY


def test_invalid_states_are_rebuilt_keeping_receipts_and_calibration() -> None:
    good = json.loads(stored().to_json())
    cases = {
        "corrupt": "{not json",
        "unknown schema": json.dumps(good | {"schema_version": 2}),
        "fingerprint mismatch": json.dumps(good | {"fingerprint": "other"}),
        "invalid fields": json.dumps(good | {"pruned": "oops"}),
    }
    for expected, text in cases.items():
        state, why = load_state(text, FP)
        assert why == expected
        assert state.pruned == {} and state.fingerprint == FP
        if expected != "corrupt":
            assert state.receipts == stored().receipts and state.calibration == 1.2
            assert state.generation == 5  # a rebuilt projection is a new view prefix
    assert load_state(None, FP) == (ContextState(fingerprint=FP, generation=first_generation(FP)), "new")


def test_out_of_bounds_calibration_is_not_trusted() -> None:
    document = json.loads(stored().to_json()) | {"calibration": 7.0}
    assert load_state(json.dumps(document), FP)[0].calibration == 1.0


def test_a_state_made_anew_starts_at_a_generation_of_its_own_branch() -> None:
    """Not at 1 for every session (see test_prepare.py, a session created again under its key), and low enough that
    versions stay exact as TypeScript numbers."""
    firsts = {first_generation(fingerprint(f"b_{i}", None)) for i in range(100)}
    assert len(firsts) == 100 and all(1 <= g <= 1 << 20 for g in firsts)
    assert view_version(max(firsts) << 1, (1 << 32) - 1) < 2**53


def test_view_versions_order_prefixes_within_a_generation() -> None:
    assert split_view_version(view_version(7, 123)) == (7, 123)
    assert view_version(7, 10) < view_version(7, 11) < view_version(8, 0)


def test_branch_state_keeps_the_projection_and_starts_a_generation() -> None:
    branch = carried_over(stored(), fingerprint("g_2", "cp_1"), "cp_1")
    assert branch.pruned == stored().pruned and branch.generation == 5
    assert branch.receipts == stored().receipts and branch.views == ()


def test_cache_state_comes_from_activity_and_ttl_only() -> None:
    assert cache_state(0.0, 1000.0, 300) == UNKNOWN
    assert cache_state(900.0, 1000.0, 0) == UNKNOWN
    assert cache_state(900.0, 1000.0, 300) == WARM
    assert cache_state(600.0, 1000.0, 300) == COLD
    assert cache_ttl_seconds(SessionConfig(context_window=1000, model="claude-sonnet-4")) == 300
    assert cache_ttl_seconds(SessionConfig(context_window=1000, model="deepseek-chat")) == 3600
    assert cache_ttl_seconds(SessionConfig(context_window=1000, cache_ttl_seconds=42)) == 42
    assert cache_ttl_seconds(SessionConfig(context_window=1000)) == 0


@pytest.mark.parametrize(
    ("model", "ttl"),
    [("openai/gpt-4.1", 300), ("us.anthropic.claude-sonnet-4-5", 300), ("o3-mini", 300), ("azure/o4-mini", 300),
     ("deepseek-ai/DeepSeek-V3", 3600), ("llama-3-70b", 0), ("solo3", 0)],
)  # fmt: skip
def test_a_model_names_its_provider_anywhere_in_its_name(model: str, ttl: int) -> None:
    assert cache_ttl_seconds(SessionConfig(context_window=1000, model=model)) == ttl


def test_a_provider_that_reported_cache_hits_is_warm_not_unknown() -> None:
    """No TTL set, no model named, but ObserveUsage reported cached input: the provider caches, so the
    state is warm or cold by the shortest documented TTL; before any hit it stays unknown."""
    config = SessionConfig(context_window=8000)
    assert cache_ttl_seconds(config) == 0
    assert cache_ttl_seconds(config, hits_observed=True) == OBSERVED_CACHE_TTL_SECONDS == 300
    state = observed(ContextState(fingerprint=FP, views=(ViewRecord(7, 1000),)), usage(7, 1000, cached=970)).state
    view = Projection(config, 0, 0, 1.0, None, (), (), {})
    answered = answer(Answering(view, replace(state, last_activity=900.0), [], 0, Action.NONE, 0, None), 0, 1000.0)
    assert answered.cache_state == WARM
    assert (
        answer(
            Answering(view, ContextState(fingerprint=FP, last_activity=900.0), [], 0, Action.NONE, 0, None), 0, 1000.0
        ).cache_state
        == UNKNOWN
    )


def test_views_with_keeps_the_newest_records_and_one_per_version() -> None:
    state = ContextState(fingerprint=FP)
    for count in range(MAX_VIEWS + 3):
        state = replace(state, views=state.views_with(ViewRecord(view_version(1, count), 100 + count)))
    assert [v.version for v in state.views] == [view_version(1, c) for c in range(3, MAX_VIEWS + 3)]
    again = state.views_with(ViewRecord(view_version(1, 5), 7))
    assert len(again) == MAX_VIEWS
    assert again[-1] == ViewRecord(view_version(1, 5), 7)
    assert [v.version for v in again].count(view_version(1, 5)) == 1


def usage(view_version: int, input_tokens: int, cached: int = 0) -> Usage:
    return Usage(view_version, 0, input_tokens, cached, 100, "stop")


def test_an_observation_of_a_known_view_moves_the_calibration_toward_its_ratio_and_counts() -> None:
    state = stored()  # view (4, 12) estimated at 8000, calibration 1.2
    seen = observed(state, usage(view_version(4, 12), 12_000, 9000))
    assert seen.accepted and seen.estimated_tokens == 8000
    assert seen.state.calibration == 1.2 + CALIBRATION_SMOOTHING * (1.5 - 1.2)
    counters = seen.state.telemetry
    assert (counters["observations"], counters["input_tokens"], counters["cached_input_tokens"]) == (1, 12_000, 9000)


def test_an_implausible_ratio_or_an_unknown_view_is_counted_but_does_not_calibrate() -> None:
    state = stored()
    for reported in (usage(view_version(4, 12), 40_000), usage(view_version(4, 99), 8000)):
        seen = observed(state, reported)
        assert not seen.accepted and seen.state.calibration == 1.2
        assert seen.state.telemetry["observations"] == 1


def test_usage_that_cannot_be_true_is_refused() -> None:
    for bad in (usage(1, -1), usage(1, 10, 11), Usage(1, 0, 10, 0, -5, "stop")):
        with pytest.raises(DomainError) as caught:
            check_usage(bad)
        assert caught.value.reason == "INVALID_USAGE"
    check_usage(usage(1, 10, 10))


def test_an_install_starts_a_generation_with_its_receipt_and_a_fold_clears_the_failed_fold_memo() -> None:
    state = replace(stored(), failed_fold_tokens=7000)
    receipt = Receipt("op2", ReceiptStatus.APPLIED, ReceiptAction.PRUNE, 9000, 6000, "pruned 2 results", 2.0)
    pruned = state.installed({"m_1": 120, "m_2": 80}, {"m_2": 400}, receipt, folded=False)
    assert pruned.generation == state.generation + 1 and pruned.last_receipt == receipt
    assert pruned.pruned == {"m_1": 120, "m_2": 80} and pruned.bounds == {"m_2": 400}
    assert pruned.failed_fold_tokens == 7000  # a prune does not fold away the input that failed
    folded = state.installed({}, {}, receipt, folded=True)
    assert folded.failed_fold_tokens == 0 and folded.generation == state.generation + 1
