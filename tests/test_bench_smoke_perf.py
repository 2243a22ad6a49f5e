"""The hot-path, fork and scale benchmarks run end to end with tiny settings and report sane,
self-consistent numbers, as a table and as JSON. They measure nothing here (no timing thresholds);
they only must not rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
TRACES = ROOT / "tests" / "data" / "traces"


@pytest.fixture(autouse=True)
def _traces() -> None:
    if not list(TRACES.glob("*.json")):
        if os.environ.get("CI"):
            pytest.fail(f"no traces in {TRACES}")
        pytest.skip(f"no traces in {TRACES}")


def run_bench(tmp_path: Path, script: str, *args: str) -> tuple[str, dict[str, Any]]:
    out = tmp_path / f"{script}.json"
    command = [sys.executable, str(BENCH / script), *args, "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, json.loads(out.read_text())


def test_hot_path_smoke(tmp_path: Path) -> None:
    backends = "sqlite,postgresql" if os.environ.get("CTXFOLD_TEST_POSTGRES_URL") else "sqlite"
    if backends == "sqlite" and os.environ.get("CI"):
        pytest.fail("CTXFOLD_TEST_POSTGRES_URL is not set in CI")
    table, doc = run_bench(tmp_path, "hot_path.py", "--quick", "--backends", backends)
    names = backends.split(",")
    assert "issue 10 goals" in table and "RSS per cached session" in table and "ObserveUsage" in table, table
    concurrency = [str(c) for c in doc["settings"]["concurrency"]]
    calls = doc["settings"]["calls"] * doc["settings"]["rounds"]
    echo = doc["echo"]
    assert echo["latency"]["calls"] == calls
    assert 0 < echo["latency"]["p50_ms"] <= echo["latency"]["p99_ms"]
    assert all(echo["calls_per_s"][c] > 0 for c in concurrency)
    for name in names:
        measured = doc["backends"][name]
        small, large = measured["latency"]["small"], measured["latency"]["large"]
        for cell in (small, large):
            assert cell["calls"] == calls and 0 < cell["p50_ms"] <= cell["p99_ms"], (name, cell)
            # every call after the first full Prepare named the version it had: all answers are deltas
            assert cell["delta_fraction"] == 1.0, (name, cell)
        for cell in (small, large):  # each call appended two messages to the view it measured
            assert cell["view_tokens_last"] > cell["view_tokens_first"] > 0, (name, cell)
        assert large["view_tokens_first"] > 5 * small["view_tokens_last"], name
        assert large["view_tokens_last"] < 0.8 * doc["settings"]["window"], name  # below the trigger: never folds
        assert measured["load_delta_fraction"] == 1.0, name
        observe = measured["observe_usage"]
        assert observe["calls"] == calls and 0 < observe["p50_ms"] <= observe["p99_ms"], (name, observe)
        assert all(measured["calls_per_s"][c] > 0 for c in concurrency), name
        assert all(measured["server_cpu_ms_per_call"][c] > 0 for c in concurrency), name
        assert measured["rss_kib_before_warming"] > 10_000 and measured["rss_kib_after_warming"] > 10_000, name
        assert measured["rss_kib_per_cached_session"] == pytest.approx(
            (measured["rss_kib_after_warming"] - measured["rss_kib_before_warming"]) / doc["settings"]["sessions"]
        )
        ratios = doc["ratios"][name]
        assert ratios["p50_large_over_echo"] == pytest.approx(large["p50_ms"] / echo["latency"]["p50_ms"])
        assert ratios["p50_large_over_small"] == pytest.approx(large["p50_ms"] / small["p50_ms"])
        for c in concurrency:
            assert ratios["calls_per_s_of_echo"][c] == pytest.approx(
                measured["calls_per_s"][c] / echo["calls_per_s"][c]
            )
    if len(names) == 2:
        assert doc["ratios"]["postgresql_over_sqlite"]["p50_large"] == pytest.approx(
            doc["backends"]["postgresql"]["latency"]["large"]["p50_ms"]
            / doc["backends"]["sqlite"]["latency"]["large"]["p50_ms"]
        )
    # five goal lines per backend (16 in flight is in the quick concurrency), one more across backends
    assert len(doc["goals"]) == 5 * len(names) + (len(names) == 2)
    for goal in doc["goals"]:
        assert goal["pass"] == (goal["value"] <= goal["limit"] if goal["at_most"] else goal["value"] >= goal["limit"])
        assert f"{'PASS' if goal['pass'] else 'MISS'}  {goal['goal']}" in table, goal


def test_fork_scale_smoke(tmp_path: Path) -> None:
    table, doc = run_bench(
        tmp_path,
        "fork_scale.py",
        *("--sizes", "2000,20000", "--view-tokens", "8000", "--window", "40000", "--rounds", "1", "--forks", "2"),
        *("--edits", "1", "--backends", "sqlite"),
    )
    assert "Fork/Rewind" in table, table
    for size in ("2000", "20000"):
        cell = doc["median"]["sqlite"][size]
        assert 0 < cell["fork_p50_ms"] <= cell["fork_p99_ms"]
        # a fork adds one session, one segment and one state, and copies no message
        assert cell["rows_per_fork"]["sessions"] == 1
        assert cell["rows_per_fork"]["messages"] == 0
        assert cell["first_prepare_folded"] == 0
        assert cell["rows_leaked_after_delete"] == {}
    assert set(doc["edit_churn_prepare_p50_ms"]["sqlite"]) == {"0", "1", "4"}


def test_scale_smoke(tmp_path: Path) -> None:
    if not os.environ.get("CTXFOLD_TEST_POSTGRES_URL"):
        if os.environ.get("CI"):
            pytest.fail("CTXFOLD_TEST_POSTGRES_URL is not set in CI")
        pytest.skip('PostgreSQL not available (run `eval "$(bash .ci/postgres.sh)"` first)')
    table, doc = run_bench(tmp_path, "scale.py", "--quick")
    assert "query plans" in table, table
    assert doc["rows"]["big"]["sessions"] > doc["rows"]["small"]["sessions"]
    assert doc["bulk_load"]["verified_clones"] > 0
    for name in ("small", "big"):
        for kind in ("folded", "plain"):
            assert 0 < doc["prepare"][name][kind]["p50_ms"] <= doc["prepare"][name][kind]["p99_ms"]
        labels = {entry["label"] for entry in doc["plans"][name]["prepare"]}
        assert {"session by id", "messages after the checkpoint (segment, seq range)"} <= labels
