"""`ctxfold sessions` and `ctxfold show` as an operator runs them, against a real server on both
stores; the rendering is also checked directly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from ctxfold_client import Checkpoint, Session, SessionConfig

from builders import create_session, prepare, user
from conftest import fresh_database, settings_for
from ctxfold.inspection import SessionReport, render_show
from ctxfold.server import RunningServer, start
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_checkpoints import checkpoints
from test_cli import ctxfold_command
from test_lineage_folds import WINDOW, fold_turns


async def ctxfold(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [*ctxfold_command(), *args],
        cwd=tmp,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_show_prints_the_view_the_chain_with_summaries_the_cache_and_receipts(
    stub: pb_grpc.ContextServiceStub, server: RunningServer, tmp_path: Path
) -> None:
    session = await create_session(stub, context_window=WINDOW)
    await prepare(stub, session.id, user("Audit the repository"))
    await fold_turns(stub, session.id, 0, 2)
    chain = await checkpoints(stub, session.id)
    done = await ctxfold(tmp_path, "show", session.id, "--server", f"127.0.0.1:{server.port}")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"session {session.id}\n")
    assert f"after checkpoint {chain[0].id} (summary {chain[0].summary_tokens:,} tokens" in out
    for checkpoint in chain:
        assert f"  {checkpoint.id}  seq ≤ {checkpoint.position_seq}  {checkpoint.summary_tokens:,} tokens" in out
        assert checkpoint.summary.splitlines()[0] in out
    assert "[head]" in out and "cache: " in out
    assert "summary applied" in out  # a receipt of the fold

    as_json = await ctxfold(tmp_path, "show", session.id, "--server", f"127.0.0.1:{server.port}", "--json")
    document = json.loads(as_json.stdout)
    assert [c["id"] for c in document["checkpoints"]] == [c.id for c in chain]
    assert document["state"]["checkpoint_id"] == chain[0].id


async def test_sessions_lists_newest_first(
    stub: pb_grpc.ContextServiceStub, server: RunningServer, tmp_path: Path
) -> None:
    older = await create_session(stub, context_window=WINDOW)
    newer = await create_session(stub, context_window=WINDOW)
    done = await ctxfold(tmp_path, "sessions", "--server", f"127.0.0.1:{server.port}", "--limit", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["SESSION", "CREATED"]
    assert [line.split()[0] for line in lines[1:]] == [newer.id, older.id]


async def test_an_unknown_session_is_one_line_and_exit_1(server: RunningServer, tmp_path: Path) -> None:
    done = await ctxfold(tmp_path, "show", "s_missing", "--server", f"127.0.0.1:{server.port}")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["ctxfold show: NOT_FOUND: session 's_missing' not found"]


async def test_the_token_flag_authenticates(backend: str, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-inspect-0123456789abcdef tenant-a\n")
    running = await start(settings_for(await fresh_database(backend, tmp_path), auth_tokens_file=str(tokens)))
    try:
        address = f"127.0.0.1:{running.port}"
        refused = await ctxfold(tmp_path, "sessions", "--server", address)
        assert refused.returncode == 1 and refused.stderr.startswith("ctxfold sessions: UNAUTHENTICATED: ")
        allowed = await ctxfold(tmp_path, "sessions", "--server", address, "--token", "tok-inspect-0123456789abcdef")
        assert allowed.returncode == 0 and allowed.stdout.strip() == "no sessions"
        # From the environment, so that the token does not show in `ps`.
        from_env = await asyncio.to_thread(
            subprocess.run,
            [*ctxfold_command(), "sessions", "--server", address],
            cwd=tmp_path,
            env={**os.environ, "CTXFOLD_TOKEN": "tok-inspect-0123456789abcdef"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert from_env.returncode == 0 and from_env.stdout.strip() == "no sessions", from_env.stderr
        missing_ca = await ctxfold(tmp_path, "sessions", "--server", address, "--tls-ca", str(tmp_path / "none.pem"))
        assert missing_ca.returncode == 1 and "cannot read" in missing_ca.stderr
    finally:
        await running.stop(grace=1.0)


@pytest.mark.parametrize("receipts", [0, 1])
def test_render_marks_abandoned_checkpoints_and_limits_receipts(receipts: int) -> None:
    session = Session(id="s_1", head_seq=9, checkpoint_id="k_2", config=SessionConfig(context_window=8000))
    chain = [
        Checkpoint(id="k_3", parent_id="k_2", position_seq=8, summary="third", summary_tokens=30),
        Checkpoint(id="k_2", position_seq=4, summary="second\nline two", summary_tokens=20, on_head_chain=True),
    ]
    state = {
        "projection_tokens": 1200,
        "cache_state": "warm",
        "prompt_cache_key": "ctxfold-s_1",
        "receipts": [
            {"time": 1, "action": "prune", "status": "applied", "tokens_in": 900, "tokens_out": 500, "reason": ""},
            {"time": 2, "action": "summary", "status": "applied", "tokens_in": 5000, "tokens_out": 900, "reason": ""},
        ],
    }
    text = render_show(SessionReport(session, chain, state), receipts, now=10.0)
    assert "  k_3  seq ≤ 8  30 tokens  -  [abandoned]  parent k_2" in text
    assert "  k_2  seq ≤ 4  20 tokens  -  [head]" in text
    assert "      second\n      line two" in text
    assert "after checkpoint k_2 (summary 20 tokens covering seq 1..4" in text
    assert "cache: warm (key ctxfold-s_1)" in text
    assert ("5,000 -> 900 tokens" in text) == (receipts == 1)
    assert "900 -> 500" not in text


def test_show_says_where_a_background_fold_stands() -> None:
    session = Session(
        id="s_1", head_seq=9, config=SessionConfig(context_window=8000, compact_ratio=0.8, prefold_ratio=0.75)
    )
    made = {"time": 1, "action": "background", "status": "prepared", "tokens_in": 6100, "tokens_out": 900}
    made["reason"] = "prepared in the background over seqs ≤ 7; installed at the trigger"
    used = {"time": 2, "action": "summary", "status": "applied", "tokens_in": 6500, "tokens_out": 1300}
    used["reason"] = "installed the fold prepared in the background at 6100 tokens"

    def shown(*receipts: dict[str, object]) -> str:
        return render_show(SessionReport(session, [], {"receipts": list(receipts)}), 5, now=10.0)

    assert "background folds from 0.75" in shown()
    assert "background fold: prepared at 6,100 tokens, installed at the trigger" in shown(made)
    assert "background fold:" not in shown(made, used)
    failed = {**made, "status": "failed", "reason": "the summarizer failed: 500"}
    assert "background fold: failed at 6,100 tokens (the summarizer failed: 500)" in shown(failed)


async def test_a_reader_that_stops_early_ends_the_output_quietly(
    stub: pb_grpc.ContextServiceStub, server: RunningServer, tmp_path: Path
) -> None:
    """`ctxfold sessions --json | head`: more output than a pipe holds (a 300 KB system prompt), a
    reader that closes it after a few bytes: exit 141, as for SIGPIPE, and no traceback."""
    await create_session(stub, system_prompt="Be thorough. " * 25_000)
    command = " ".join([*ctxfold_command(), "sessions", "--json", "--server", f"127.0.0.1:{server.port}"])
    script = f"{command} 2>err.txt | head -c 20 >/dev/null; echo ${{PIPESTATUS[0]}} > status.txt"
    await asyncio.to_thread(subprocess.run, ["bash", "-c", script], cwd=tmp_path, timeout=60, check=True)
    assert (tmp_path / "status.txt").read_text().strip() == "141"
    assert (tmp_path / "err.txt").read_text() == ""
