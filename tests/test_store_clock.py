"""The store stamps every row and times every lease with the clock it is given, never the system's (and
the service stamps appends with the store's)."""

from __future__ import annotations

from pathlib import Path

from conftest import fresh_database
from ctxfold.engine.model import NewMessage, Role, SessionConfig, config_to_json
from ctxfold.engine.transcript import AppendLimits
from ctxfold.service.contexts import Contexts
from ctxfold.store import Store
from ctxfold.store.database import create_engine, migrate
from ctxfold.store.rows import ConfigTokens


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_rows_and_fold_leases_follow_the_injected_clock(backend: str, tmp_path: Path) -> None:
    engine = create_engine(await fresh_database(backend, tmp_path))
    try:
        await migrate(engine)
        clock = FakeClock(1_000.0)
        store = Store(engine, clock)
        config = config_to_json(SessionConfig(context_window=8000))
        session = await store.create_session("tenant", config, ConfigTokens(0, 0))
        assert (session.create_time, session.update_time) == (1_000.0, 1_000.0)

        clock.now = 2_000.0
        contexts = Contexts(store, AppendLimits(1 << 20, 1 << 20))
        appended, after = await contexts.append_messages("tenant", session.id, [NewMessage(Role.USER, "hello")], "")
        assert [(m.seq, m.create_time) for m in appended] == [(1, 2_000.0)]
        assert after.update_time == 2_000.0
        snapshot = await store.load_context("tenant", session.id)
        assert [m.create_time for m in snapshot.after] == [2_000.0]

        # A lease taken at 2000 for 30 s holds until 2030 on the store's clock, whatever the wall clock says.
        assert await store.take_fold_lease(after, "a", 30.0) == (0.0, "a")
        assert await store.take_fold_lease(after, "b", 30.0) == (2_030.0, "a")
        clock.now = 2_031.0
        assert await store.take_fold_lease(after, "b", 30.0) == (0.0, "b")
        assert await store.fold_lease_until(after) == 2_061.0
    finally:
        await engine.dispose()
