"""bench/gateway.py runs end to end (tiny sizes) and prints every mode, the goals, the stall and the saving: it
measures nothing here; it only must not rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_the_gateway_benchmark_runs(tmp_path: Path, api: str) -> None:
    out = tmp_path / "result.json"
    command = [sys.executable, str(ROOT / "bench" / "gateway.py"), "--quick", "--api", api, "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    saving = "saving over" if api == "chat" else "saving:"
    expected = ("direct ", "pass_through ", "ctxfold ", "goal added p50", "stall: one request of 2,000", saving)
    for line in (*expected, "memory: gateway RSS"):
        assert line in result.stdout, result.stdout
    document = json.loads(out.read_text())
    assert set(document["modes"]) == {"direct", "pass_through", "ctxfold"}
    assert all(mode["requests_per_s"] > 0 for mode in document["modes"].values())
    assert all(mode["cpu_ms_per_call"] > 0 for mode in document["modes"].values())  # the client's, at least
    assert document["stall"]["probes"] > 0
    assert [sessions for sessions, _ in document["memory"]["rss_mib"]] == [0, 1, 2, 3]
    assert all(rss > 0 for _, rss in document["memory"]["rss_mib"])
    if api == "chat":
        assert document["saving"]["upstream_tokens"] < document["saving"]["agent_tokens"]
