"""kill -9 of `ctxfold serve` mid-work, then a restart on the same database: nothing acknowledged
is lost or doubled, seqs stay contiguous, the view holds at most one summary, every tool result
reads back with its sha256, and the next Prepare answers within seconds. A few trials here (CI's
budget); `bench/chaos.py` runs long campaigns of the same trial."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from conftest import fresh_database
from fake_provider import FakeProvider

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import chaos

# A restarted server must answer well within this: the lease of the killed process runs out in
# seconds (it was 300 s), and a Prepare whose view fits does not wait for it at all.
ANSWER_WITHIN_SECONDS = 15.0


async def test_kill_minus_nine_during_appends_and_folds_loses_nothing(backend: str, tmp_path: Path) -> None:
    for delay in (0.7, 2.5):

        async def kill_after(acknowledged: list[int], delay: float = delay) -> None:
            # Counted from the first acknowledged turn, not from the start: a loaded machine may take
            # longer than `delay` to start the server, and a kill before any work tests nothing.
            while not acknowledged:  # noqa: ASYNC110 - the agent task appends to a plain list
                await asyncio.sleep(0.05)
            await asyncio.sleep(delay)

        result = await chaos.trial(backend, await fresh_database(backend, tmp_path), tmp_path, kill_after)
        assert not result.problems, result
        assert result.killed_after_turns > 0 and result.prepare_seconds < ANSWER_WITHIN_SECONDS, result


async def test_kill_minus_nine_mid_fold_does_not_block_the_session(backend: str, tmp_path: Path) -> None:
    with FakeProvider() as fake:
        fake.script(then="stall")  # the first fold hangs in the summarizer: the process dies holding the lease
        specs = json.dumps({"llm": {"type": "openai", "base_url": fake.base_url, "model": "m", "max_retries": 0}})

        async def kill_mid_fold(acknowledged: list[int]) -> None:
            assert await asyncio.to_thread(fake.stalled.wait, 60), "no fold reached the summarizer"
            fake.script(then="ok")  # the restarted server's folds succeed

        database = await fresh_database(backend, tmp_path)
        result = await chaos.trial(backend, database, tmp_path, kill_mid_fold, summarizers=specs, summarizer="llm")
        fake.release()
    assert not result.problems, result
    assert result.prepare_seconds < ANSWER_WITHIN_SECONDS, result
