"""Opt-in: a fold's trace sent to a real Jaeger and read back from its query API.

    bash .ci/build-jaeger.sh /tmp/jaeger          # builds Jaeger from the Go module proxy (~12 min)
    CTXFOLD_JAEGER_BIN=/tmp/jaeger/bin/jaeger .venv/bin/pytest tests/test_jaeger_e2e.py

Jaeger's all-in-one configuration takes fixed ports (OTLP 4317, query 16686, 8888, ...); the test
skips unless CTXFOLD_JAEGER_BIN names the binary."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest

from builders import call, create_session, result, user
from conftest import free_port
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from traces import tool_output

JAEGER = os.environ.get("CTXFOLD_JAEGER_BIN", "")
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not JAEGER, reason="opt-in: set CTXFOLD_JAEGER_BIN (see .ci/build-jaeger.sh)")


def query(path: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:16686{path}", timeout=2) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]
    except OSError:
        return None


async def test_a_fold_trace_reaches_jaeger(tmp_path: Path) -> None:
    # The documented recipe: every Jaeger port on loopback, traces only (Jaeger takes no metrics).
    jaeger = await asyncio.create_subprocess_exec(
        "bash", str(ROOT / ".ci" / "jaeger.sh"), JAEGER, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    server_log = tmp_path / "serve.log"
    port = free_port()
    service = f"ctxfold-e2e-{uuid.uuid4().hex[:6]}"
    server = None
    try:
        deadline = time.monotonic() + 60
        while query("/api/services") is None:
            assert time.monotonic() < deadline, "Jaeger did not start"
            await asyncio.sleep(0.5)
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_SERVICE_NAME": service,
        }
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ctxfold.cli", "serve", "--listen", f"127.0.0.1:{port}",
            "--data-dir", str(tmp_path), env=env, stderr=server_log.open("wb"),
        )  # fmt: skip
        trace_id = uuid.uuid4().hex
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 30)
            stub = pb_grpc.ContextServiceStub(channel)
            session = await create_session(stub, context_window=4000, max_output_tokens=256)
            metadata = (("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),)
            folded = False
            for i in range(12):
                request = pb.PrepareRequest(
                    session_id=session.id, append=[call(f"c{i}"), result(f"c{i}", tool_output(i, 1500))]
                )
                if i == 0:
                    request.append.insert(0, user("start"))
                async for event in stub.Prepare(request, metadata=metadata):
                    folded |= event.HasField("result") and event.result.action == pb.ACTION_FOLDED
            assert folded
        wanted = {"ctxfold.fold", "ctxfold.fold.pass", "ctxfold.summarize extractive", "ctxfold.checkpoint.install"}
        names: set[str] = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not wanted <= names:
            found = query(f"/api/traces/{trace_id}") or {}
            spans = [span for t in found.get("data") or [] for span in t["spans"]]  # type: ignore[attr-defined]
            names = {span["operationName"] for span in spans}
            await asyncio.sleep(0.5)
        assert wanted <= names, names
        services = query("/api/services") or {}
        assert service in (services.get("data") or [])  # type: ignore[operator]
        assert "Failed to export" not in server_log.read_text(), server_log.read_text()
    finally:
        for process in (server, jaeger):
            if process is not None and process.returncode is None:
                process.terminate()
                await asyncio.wait_for(process.wait(), 30)
