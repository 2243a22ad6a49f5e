"""`ctxfold replay` end to end: the real command on a recorded trace against an embedded server, and
the replay client against a running server that requires a bearer token."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import settings_for
from ctxfold.replay.options import Options, ReplayError, load_trace_file
from ctxfold.replay.prices import BUILT_IN
from ctxfold.replay.runner import replay
from ctxfold.server import start

TRACES = Path(__file__).resolve().parent / "data" / "traces"
SMALL_TRACE = TRACES / "openhands-multi-swe-bench-0.json"
TOKEN = "replay-test-token-0123456789"


def ctxfold_command() -> list[str]:
    script = Path(sys.executable).parent / "ctxfold"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ctxfold.cli"]


def run_replay(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXFOLD_")}
    env["XDG_DATA_HOME"] = str(tmp / "xdg")
    return subprocess.run(
        [*ctxfold_command(), "replay", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
        env=env,
        check=False,
    )


def model_calls(path: Path) -> int:
    return sum(m["role"] == "assistant" for m in json.loads(path.read_text())["messages"])


needs_traces = pytest.mark.skipif(not SMALL_TRACE.exists(), reason=f"no traces in {TRACES}")


@needs_traces
def test_replay_json_is_consistent_and_folds_at_a_small_window(tmp_path: Path) -> None:
    plot = tmp_path / "replay.png"
    can_plot = importlib.util.find_spec("matplotlib") is not None
    args = [str(SMALL_TRACE), "--window", "8000", "--json"] + (["--plot", str(plot)] if can_plot else [])
    result = run_replay(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    # No progress bar when stderr is not a terminal; only where the plot went.
    assert result.stderr == (f"ctxfold replay: plot written to {plot}\n" if can_plot else "")
    doc = json.loads(result.stdout)

    calls = model_calls(SMALL_TRACE)
    assert doc["turns"] == calls == len(doc["series_view_tokens"]) == len(doc["series_actions"])
    assert doc["cache_hit_tokens"] + doc["cache_miss_tokens"] == doc["input_tokens"] == sum(doc["series_view_tokens"])
    assert doc["folds"] > 0 and doc["series_actions"].count("folded") == doc["folds"]
    assert doc["summarizer_calls"] >= doc["folds"] and doc["summary_output_tokens"] > 0
    assert doc["prunes"] >= 0 and doc["failed_summaries"] == 0 and doc["refused_calls"] == 0
    assert doc["peak_view_tokens"] == max(doc["series_view_tokens"]) < 8000
    assert doc["mean_view_tokens"] == pytest.approx(statistics.mean(doc["series_view_tokens"]))
    assert 0 < doc["cache_hit_ratio"] <= doc["ideal_cache_hit_ratio"] < 1
    sheet = BUILT_IN["deepseek-chat"]
    assert (doc["prices"], doc["provider_cache"], doc["price_source"]) == ("deepseek-chat", "deepseek", sheet.source)
    expected = sheet.cost(doc["cache_hit_tokens"], doc["cache_miss_tokens"], 0, doc["output_tokens"])
    assert doc["cost"] == pytest.approx(expected)
    assert doc["total_cost"] == pytest.approx(doc["cost"] + doc["summarizer_cost"])
    assert doc["total_cost"] == pytest.approx(doc["series_cumulative_cost"][-1])
    assert 0 <= doc["recoverable_tool_results"] <= doc["dropped_tool_results"] > 0
    # The probes of the last view, next to cost: the trace's only later user message is OpenHands'
    # "Added workspace context" (machine-written, no instruction), and it touched 9 paths.
    assert doc["task_kept"] in (0, 1) and doc["instructions"] == 0 and doc["paths"] == 9
    assert doc["instructions_kept"] == 0 and 0 <= doc["paths_named"] <= 9 and doc["machine_quoted"] == 0
    assert doc["settings"]["window"] == 8000 and doc["settings"]["ratio"] == 0.8
    if can_plot:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_traces
def test_replay_table_with_anthropic_prices(tmp_path: Path) -> None:
    trace = TRACES / "swe-agent-pydicom-1458.json"
    result = run_replay(tmp_path, str(trace), "--window", "8000", "--prices", "claude-sonnet-4.5", "--quiet")
    assert result.returncode == 0, result.stderr
    table = result.stdout
    assert "provider cache: anthropic" in table and "as published" in table
    assert f"turns (model calls) {model_calls(trace)}" in " ".join(table.split())
    rows = ("folds", "prunes", "peak view tokens", "mean view tokens", "cache hits", "cache misses", "total cost")
    probes = ("task (opening user message) kept", "person's later instructions kept", "touched file paths named")
    for row in (*rows, *probes, "hidden tool results reachable"):
        assert row in table
    assert "written)" in table  # Anthropic bills cache writes


def test_replay_refuses_bad_input(tmp_path: Path) -> None:
    missing = run_replay(tmp_path, str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    (tmp_path / "t.jsonl").write_text('{"role": "user", "content": "hi"}\n{"role": "assistant", "content": "yo"}\n')
    prices = run_replay(tmp_path, str(tmp_path / "t.jsonl"), "--prices", "nonsense")
    assert prices.returncode == 2 and "unknown price sheet" in prices.stderr
    traceparent = run_replay(tmp_path, str(tmp_path / "t.jsonl"), "--traceparent", "00-abc-def-01")
    assert traceparent.returncode == 2 and "--traceparent: not a W3C traceparent" in traceparent.stderr


@needs_traces
async def test_replay_through_a_running_server_with_a_bearer_token(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} team-a\n")
    running = await start(settings_for(f"sqlite:///{tmp_path / 'db.sqlite'}", auth_tokens_file=str(tokens)))
    try:
        trace = load_trace_file(TRACES / "swe-agent-pydicom-1458.json")
        address = f"127.0.0.1:{running.port}"
        result = await replay(trace, Options(window=8000, prices=BUILT_IN["gpt-5"]), server=address, token=TOKEN)
        assert result.turns == model_calls(TRACES / "swe-agent-pydicom-1458.json")
        assert result.folds > 0 and result.provider_cache == "openai"
        with pytest.raises(ReplayError, match="UNAUTHENTICATED"):
            await replay(trace, Options(window=8000), server=address, token="wrong-token-0123456789")
    finally:
        await running.stop(grace=1.0)


@needs_traces
@pytest.mark.parametrize(("window", "folds"), [(8000, 1), (16000, 0)])
def test_replay_bills_every_background_summary_installed_or_not(tmp_path: Path, window: int, folds: int) -> None:
    """With background folds, every summary made ahead of the trigger is billed: one installed at a
    trigger as a fold's request (at 8k), one never installed (this trace ends past the prefold ratio
    before the next trigger) as paid for nothing; with them off the same trace makes none of them."""
    trace = TRACES / "swe-agent-pydicom-1458.json"
    off, on = (
        json.loads(run_replay(tmp_path, str(trace), "--window", str(window), "--prefold-ratio", r, "--json").stdout)
        for r in ("0", "0.7")
    )
    assert off["unused_summaries"] == 0
    made = on["summarizer_calls"] - off["summarizer_calls"]
    assert on["folds"] == off["folds"] == folds
    assert made == 1 and on["unused_summaries"] == 1
    assert on["summarizer_cost"] > off["summarizer_cost"]
    assert on["settings"]["prefold_ratio"] == 0.7
    # The agent waits for the summaries of its folds with them off, for none with them on.
    assert on["summary_wait_seconds"] == 0
    assert (off["summary_wait_seconds"] > 0) is (folds > 0)
    assert off["summary_wait_max_seconds"] <= off["summary_wait_seconds"]
