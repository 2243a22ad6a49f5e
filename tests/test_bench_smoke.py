"""The AppendMessages benchmark runs end to end (tiny settings, SQLite only) and reports positive
numbers, both as the table and as JSON. It measures nothing here; it only must not rot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "append_throughput.py"
TRACES = ROOT / "tests" / "data" / "traces"


def test_append_throughput_benchmark_smoke(tmp_path: Path) -> None:
    if not list(TRACES.glob("*.json")):
        if os.environ.get("CI"):
            pytest.fail(f"no traces in {TRACES}")
        pytest.skip(f"no traces in {TRACES}")
    out = tmp_path / "result.json"
    command = [sys.executable, str(BENCH), "--rounds", "1", "--seconds", "0.5", "--warmup", "0.2"]
    command += ["--backends", "sqlite", "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    table = result.stdout
    for title in ("a) 1 client, single messages", "b) 16 sessions, batches of 10", "c) 200 KiB tool results"):
        assert title in table, table
    rows = [line for line in table.splitlines() if re.search(r"(msgs/s|calls/s|results/s|MiB/s|ms/call)\s", line)]
    assert len(rows) == 11, table
    for line in rows:
        assert float(line.split()[-1]) > 0, line

    document = json.loads(out.read_text())
    assert list(document["median"]) == ["sqlite"]
    medians = document["median"]["sqlite"]
    for scenario in ("sequential", "concurrent", "tool_results"):
        assert medians[scenario]["messages_per_s"] > 0, scenario
        assert medians[scenario]["p50_ms"] > 0, scenario
        assert medians[scenario]["p99_ms"] >= medians[scenario]["p50_ms"], scenario
    assert medians["tool_results"]["mib_per_s"] > 0
    assert document["settings"]["tool_result_bytes"] > 190 * 1024
    assert document["settings"]["trace_messages"] > 0
