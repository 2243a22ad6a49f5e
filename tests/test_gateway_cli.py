"""`ctxfold serve --gateway-listen` runs the gateway beside the server and says so; `ctxfold gateway`
refuses bad settings with one line and exit 2; an upstream that cannot be reached is a 502 in the
provider's error shape."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port
from test_cli import clean_environ, ctxfold_command, serving


def post(url: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": "Bearer sk-cli"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_serve_runs_the_gateway_beside_the_server(tmp_path: Path) -> None:
    port, gateway_port, dead = free_port(), free_port(), free_port()
    args = ["--listen", f"127.0.0.1:{port}", "--gateway-listen", f"127.0.0.1:{gateway_port}",
            "--openai-base-url", f"http://127.0.0.1:{dead}"]  # fmt: skip
    with serving(tmp_path, args, {}, port) as served:
        deadline = time.monotonic() + 30
        while f"ctxfold gateway serving on 127.0.0.1:{gateway_port}" not in served.stderr():
            assert time.monotonic() < deadline, served.stderr()
            time.sleep(0.1)
        status, body = post(f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
                            {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert status == 502
    error = body["error"]
    assert isinstance(error, dict) and "upstream cannot be reached" in str(error["message"])


def run_gateway(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ctxfold_command(), "gateway", *args], cwd=tmp, env=clean_environ(tmp, {}),
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (("--fail-mode", "sideways"), "setting fail_mode: 'sideways' is not 'open' or 'closed'"),
        (("--openai-base-url", "api.openai.com"),
         "setting openai_base_url: 'api.openai.com' is not an http(s) URL (e.g. https://api.openai.com)"),
        (("--anthropic-base-url", "ftp://x"),
         "setting anthropic_base_url: 'ftp://x' is not an http(s) URL (e.g. https://api.openai.com)"),
        (("--timeout-seconds", "0"), "setting timeout_seconds: '0' is below its minimum, 0.1"),
        (("--max-read-rounds", "-1"), "setting max_read_rounds: '-1' is below its minimum, 0"),
    ],
)  # fmt: skip
def test_a_bad_gateway_setting_is_one_line_and_exit_2(tmp_path: Path, flags: tuple[str, ...], line: str) -> None:
    result = run_gateway(tmp_path, *flags)
    assert result.returncode == 2
    assert result.stderr.strip() == f"ctxfold gateway: {line}"


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run_gateway(tmp_path, "--listen", f"127.0.0.1:{taken.getsockname()[1]}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxfold gateway: cannot listen on 127.0.0.1:"), result.stderr
