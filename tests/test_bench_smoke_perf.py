"""The Prepare-latency, fork, load and scale benchmarks run end to end with tiny settings and report
sane numbers, as a table and as JSON. They measure nothing here; they only must not rot."""

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


def test_prepare_latency_smoke(tmp_path: Path) -> None:
    table, doc = run_bench(
        tmp_path,
        "prepare_latency.py",
        *("--sizes", "2000,20000", "--view-tokens", "8000", "--window", "40000", "--rounds", "1", "--calls", "3"),
        *("--fold-tokens", "20000", "--fold-rounds", "1", "--engine-repeats", "1", "--backends", "sqlite"),
    )
    assert "append-only Prepare" in table and "service-level fold" in table, table
    cells = doc["prepare"]["sqlite"]
    for key in ("2000/full", "2000/delta", "20000/full", "20000/delta"):
        assert 0 < cells[key]["service_p50_ms"] <= cells[key]["service_p99_ms"], key
        assert cells[key]["rpc_p50_ms"] >= cells[key]["service_p50_ms"] * 0.5, key
        assert cells[key]["statements"] > 0, key
    # a delta answer carries only the new message; the full one the whole view
    assert cells["20000/delta"]["response_bytes"] < cells["20000/full"]["response_bytes"] / 5
    assert cells["20000/delta"]["delta_fraction"] == 1.0
    assert doc["sessions"]["sqlite"]["20000"]["folds"] >= 1
    assert (
        doc["engine_fold"]["total_ms"] > 0 and doc["engine_fold"]["tokens_after"] < doc["engine_fold"]["tokens_before"]
    )
    fold = cells["fold"]
    assert 0 < fold["summarizer_ms"] < fold["service_ms"]


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
        assert cell["fork_server_p50_ms"] > 0
        # a fork adds one session, one segment and one state, and copies no message
        assert cell["rows_per_fork"]["sessions"] == 1
        assert cell["rows_per_fork"]["messages"] == 0
        assert cell["first_prepare_folded"] == 0
        assert cell["rows_leaked_after_delete"] == {}
    assert set(doc["edit_churn_prepare_p50_ms"]["sqlite"]) == {"0", "1", "4"}


def test_load_smoke(tmp_path: Path) -> None:
    table, doc = run_bench(
        tmp_path,
        "load.py",
        *("--concurrency", "1,4", "--rounds", "1", "--seconds", "0.3", "--warmup", "0.1"),
        *("--prefill-tokens", "1000", "--idle-sessions", "20", "--idle-batches", "1", "--backends", "sqlite"),
    )
    assert "echo" in table, table
    for target in ("sqlite", "echo"):
        for concurrency in ("1", "4"):
            cell = doc["median"][target][concurrency]
            assert cell["requests_per_s"] > 0 and 0 < cell["p50_ms"] <= cell["p99_ms"], (target, concurrency)
    # the echo server answers with a recorded Prepare response: same size, give or take a varint
    assert abs(doc["median"]["sqlite"]["1"]["response_bytes"] - doc["median"]["echo"]["1"]["response_bytes"]) < 16
    assert len(doc["idle_memory"]["sqlite"]["rss_kib"]) == 2
    assert min(doc["idle_memory"]["sqlite"]["rss_kib"]) > 0


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
            assert doc["prepare"][name][kind]["server_p50_ms"] > 0
        labels = {entry["label"] for entry in doc["plans"][name]["prepare"]}
        assert {"session by id", "messages after the checkpoint (segment, seq range)"} <= labels
