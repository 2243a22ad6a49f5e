"""bench/replay_compare.py runs end to end on one trace with a tiny setting (one ctxfold ratio, two
small windows) and writes its JSON, with the probes next to cost, and plots. It measures nothing
here; it only must not rot."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "replay_compare.py"
TRACE = ROOT / "tests" / "data" / "traces" / "openhands-multi-swe-bench-1.json"
POLICIES = [
    "ctxfold ratio 0.80 (default)",
    "ctxfold ratio 0.80, background from 0.75",
    "summarize-all",
    "summarize-all, keeps user messages",
    "clear-tool-uses",
    "masking M=10",
    "rolling",
    "truncate",
    "full-history (no window)",
]
PROBES = ("task", "instructions", "paths", "reachable")


def test_replay_compare_smoke(tmp_path: Path) -> None:
    if not TRACE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"missing {TRACE}")
        pytest.skip(f"missing {TRACE}")
    can_plot = importlib.util.find_spec("matplotlib") is not None
    out = tmp_path / "results"
    command = [sys.executable, str(BENCH), "--traces", str(TRACE), "--window", "8000", "12000", "--ratios", "0.8"]
    command += ["--out", str(out), "--quiet"] + ([] if can_plot else ["--no-plots"])
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    for window in ("8,000", "12,000"):
        assert f"openhands-multi-swe-bench-1.json: 33 model calls, window {window}" in result.stdout
        assert f"summary: 1 traces, window {window}" in result.stdout
    assert (
        "cheapest within the window, of the policies that never refused a call: deepseek " in result.stdout
        and "ideal cache-hit ratio" in result.stdout
    )
    document = json.loads((out / "replay.json").read_text())
    assert [(row["window"], row["policy"]) for row in document["summary"]] == [
        (window, policy) for window in (8000, 12000) for policy in POLICIES
    ]
    for row in document["summary"]:
        assert set(row["total_cost"]) == {"deepseek-chat", "gpt-5", "claude-sonnet-4.5"}
        assert 0 <= row["recoverable_tool_results"] <= row["dropped_tool_results"]
        assert set(row["probes"]) == set(PROBES) and row["paths"] == 4 and row["instructions"] == 1
        assert 0 <= row["task_kept"] <= row["traces"] == 1
    # Tool results a store keeps are reachable only for ctxfold: the baselines have no store.
    by_policy = {row["policy"]: row for row in document["summary"] if row["window"] == 8000}
    assert by_policy["ctxfold ratio 0.80 (default)"]["recoverable_tool_results"] > 0
    assert by_policy["clear-tool-uses"]["recoverable_tool_results"] == 0
    assert by_policy["summarize-all, keeps user messages"]["probes"]["instructions"] == 1.0
    # What the agent waits for summaries: for each fold's in the foreground, for none made in the background.
    assert by_policy["ctxfold ratio 0.80 (default)"]["summary_wait_seconds"] > 0
    assert by_policy["summarize-all"]["summary_wait_seconds"] > 0
    assert by_policy["ctxfold ratio 0.80, background from 0.75"]["summary_wait_seconds"] == 0
    assert by_policy["clear-tool-uses"]["summary_wait_seconds"] == 0
    assert "wait s" in result.stdout
    assert [t["window"] for t in document["traces"]] == [8000, 12000]
    for trace in document["traces"]:
        assert trace["model_calls"] == 33 and 0 < trace["ideal_cache_hit_ratio"] < 1
        for run in trace["results"]:
            assert run["turns"] == 33
            assert run["cache_hit_tokens"] + run["cache_miss_tokens"] == run["input_tokens"] > 0
            assert run["total_cost"] > 0
        assert trace["results"][0]["folds"] > 0
        assert set(trace["other_sheets"]) == {"gpt-5", "claude-sonnet-4.5"}
    if can_plot:
        for name in ("replay-openhands-multi-swe-bench-1-w8000.png", "replay-summary-w12000.png"):
            assert (out / name).read_bytes()[:4] == b"\x89PNG"
