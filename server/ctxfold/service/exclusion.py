"""Which replica may fold a session: one per database at a time, the holder of its fold lease (within a process,
one call at a time: `contexts.KeyedLock`); why: docs/architecture.md, The view and maintenance."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ctxfold.engine.context import SessionRecord
from ctxfold.store import Store

log = logging.getLogger(__name__)

# A fold holds the session's lease for this long at a time and renews it while it runs, so the lease
# of a crashed holder runs out within seconds, however long its summarizer call would have taken.
FOLD_LEASE_SECONDS = 10.0
FOLD_LEASE_RENEW_SECONDS = FOLD_LEASE_SECONDS / 4
FOLD_LEASE_POLL_SECONDS = 0.25


class Lease(enum.Enum):
    TAKEN = "taken"
    WAITED = "waited"  # another holder's lease ended (released or run out) while we waited
    HELD_ELSEWHERE = "held_elsewhere"  # another holder folds; we did not wait


@dataclass(frozen=True)
class LeaseOutcome:
    lease: Lease
    holder: str = ""  # who holds it, when not us
    until: float = 0.0  # when its lease runs out (the store's clock)


# A lease holder: host, pid and a token of this process (a restarted container reuses the dead one's pid), then
# one id per call; a holder on this host whose process is gone (`died`) loses its lease at once.
_HOST = socket.gethostname()[:24]
_PROCESS = f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def died(holder: str) -> bool:
    """Whether `holder` was a process of this host that no longer runs (False when it cannot be told)."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return not holder.startswith(f"{_PROCESS}:")  # an earlier process with our pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # a process of another user runs with that pid
    return False


@contextlib.asynccontextmanager
async def holding(store: Store, session: SessionRecord, wait: bool) -> AsyncIterator[LeaseOutcome]:
    """TAKEN: the lease is held, renewed, until the body ends (even cancelled). Else nothing is held: HELD_ELSEWHERE at
    once, or with `wait` WAITED once it ended (re-read the session). A holder dead on this host loses it at once."""
    owner = f"{_PROCESS}:{uuid.uuid4().hex[:8]}"
    until, holder = await store.take_fold_lease(session, owner, FOLD_LEASE_SECONDS)
    if until and died(holder):
        log.info("session %s: the fold lease of %s, which no longer runs, is taken over", session.id, holder)
        until, holder = await store.take_fold_lease(session, owner, FOLD_LEASE_SECONDS, replacing=holder)
    if until:
        if wait:
            # Lease times are the store's clock.
            while until and until > store.clock():
                await asyncio.sleep(min(FOLD_LEASE_POLL_SECONDS, until - store.clock()))
                until = await store.fold_lease_until(session)
        yield LeaseOutcome(Lease.WAITED if wait else Lease.HELD_ELSEWHERE, holder, until)
        return
    heartbeat = asyncio.create_task(_renew(store, session, owner))
    try:
        yield LeaseOutcome(Lease.TAKEN)
    finally:
        heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await heartbeat
        # Shielded: a cancelled call still hands the lease back (else it would run out by itself).
        await asyncio.shield(store.release_fold_lease(session, owner))


async def _renew(store: Store, session: SessionRecord, owner: str) -> None:
    """Renews the lease while the fold runs; a failed renewal waits for the next beat (the lease outlives a few)."""
    while True:
        await asyncio.sleep(FOLD_LEASE_RENEW_SECONDS)
        try:
            await store.take_fold_lease(session, owner, FOLD_LEASE_SECONDS)
        except Exception as exc:  # the fold goes on; the next beat tries again
            log.warning("renewing the fold lease of session %s failed: %s", session.id, exc)
