"""bench/replay_compare.py runs end to end on one trace with a tiny setting (one ctxfold ratio, a
small window) and writes its JSON and plots. It measures nothing here; it only must not rot."""

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
    "summarize-all",
    "rolling",
    "masking",
    "truncate",
    "full-history (no window)",
]


def test_replay_compare_smoke(tmp_path: Path) -> None:
    if not TRACE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"missing {TRACE}")
        pytest.skip(f"missing {TRACE}")
    can_plot = importlib.util.find_spec("matplotlib") is not None
    out = tmp_path / "results"
    command = [sys.executable, str(BENCH), "--traces", str(TRACE), "--window", "8000", "--ratios", "0.8"]
    command += ["--out", str(out), "--quiet"] + ([] if can_plot else ["--no-plots"])
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    assert "openhands-multi-swe-bench-1.json: 33 model calls, window 8,000" in result.stdout
    assert "summary: 1 traces" in result.stdout and "ideal cache-hit ratio" in result.stdout
    document = json.loads((out / "replay.json").read_text())
    assert [row["policy"] for row in document["summary"]] == POLICIES
    (trace,) = document["traces"]
    assert trace["model_calls"] == 33 and 0 < trace["ideal_cache_hit_ratio"] < 1
    for run in trace["results"]:
        assert run["turns"] == 33
        assert run["cache_hit_tokens"] + run["cache_miss_tokens"] == run["input_tokens"] > 0
        assert run["total_cost"] > 0
    assert trace["results"][0]["folds"] > 0
    assert set(trace["other_sheets"]) == {"gpt-5", "claude-sonnet-4.5"}
    if can_plot:
        for name in ("replay-openhands-multi-swe-bench-1.png", "replay-summary.png"):
            assert (out / name).read_bytes()[:4] == b"\x89PNG"
