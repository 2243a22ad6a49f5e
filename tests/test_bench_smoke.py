"""The AppendMessages and availability benchmarks run end to end (tiny settings, SQLite only) and
report what they should: positive numbers, as the table and as JSON; every load's outcome. They
measure nothing here; they only must not rot."""

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


def test_availability_benchmark_smoke(tmp_path: Path) -> None:
    """Every load of `bench/availability.py` runs at small limits and gets the outcome it should: the
    appends, Prepares, views and the fold answer, the request twice the limit is refused by gRPC."""
    command = [sys.executable, str(ROOT / "bench" / "availability.py"), "--backends", "sqlite", "--clients", "2"]
    command += ["--max-receive-message-bytes", str(2 << 20), "--max-send-message-bytes", str(3 << 20)]
    command += ["--max-message-bytes", str(256 << 10), "--max-tool-result-bytes", str(1 << 20)]
    command += ["--fold-messages", "3000"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # Each load's row: its name, then request MiB, client s, outcome and six numbers.
    rows = {line.split("  ")[0].strip(): line.split()[-7] for line in result.stdout.splitlines() if "  " in line}
    expected = {
        "idle": "OK",
        "append 8 x user message": "OK",
        "append 1 x tool result": "OK",
        "prepare, append 8 x user message": "OK",
        "2 clients x append 8 x user": "OK",
        "2 clients x prepare, whole view": "OK",
        "prepare folding 3,000 short messages": "OK",
        "append 17 x user message": "RESOURCE_EXHAUSTED",
    }
    assert {name: rows.get(name) for name in expected} == expected, result.stdout
    assert "b) one 16 KiB page" in result.stdout, result.stdout


def test_background_benchmark_smoke(tmp_path: Path) -> None:
    """Both modes replay the same turns; the 'off' sessions wait for the summarizer at their trigger,
    the 'on' sessions install what was prepared (the bench's goal line is printed, not asserted)."""
    out = tmp_path / "result.json"
    command = [sys.executable, str(ROOT / "bench" / "background.py"), "--quick", "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "goal: with background folds on every Prepare within 0.5 s:" in result.stdout
    document = json.loads(out.read_text())
    assert document["table"]["on"]["every"]["n"] == document["table"]["off"]["every"]["n"] == 30
    assert document["table"]["off"]["at_trigger"]["n"] >= 1
    assert document["table"]["off"]["at_trigger"]["max"] >= 0.6  # it waited for a summary
    assert document["on"]["installed_prepared"] >= 1


def test_prepare_path_benchmark_traces_the_append_path(tmp_path: Path) -> None:
    """bench/prepare_path.py traces a real delta Prepare: it enters the servicer, the maintenance driver,
    the contexts and the one write, and the engine's append."""
    out = tmp_path / "path.json"
    command = [sys.executable, str(ROOT / "bench" / "prepare_path.py"), "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(out.read_text())
    assert "api/servicer.py" in document["door"]["modules"], document
    for module in ("service/maintenance.py", "service/contexts.py", "store/append_sqlite.py"):
        assert module in document["use_case"]["modules"], document
    assert "engine/context.py" in document["engine_modules"]
    assert document["stops"][0].startswith("api/") and len(document["stops"]) >= len(document["shell_modules"])
    assert "goal: at most 6 shell modules behind the door" in result.stdout
    # Issue 22's shape: the file-moved check once added store/database.py as a seventh stop.
    assert document["goal_pass"], document["use_case"]
