"""A real SQLite store for tests of one storage module at a time: the database file in
``tmp_path`` (every migration applied), the leader lease taken, a manual clock, and a way to lose
the lease to a successor so that a test can show a stale authority writes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.integration.leader_env import ManualClock
from topicbus.core.authority import Authority
from topicbus.storage.db import Database
from topicbus.storage.lease import LeaseRepository

LEASE_STALE_MS = 8_000


@dataclass
class StoreEnv:
    db: Database
    authority: Authority  # the current leader's authority (replaced by take_over)
    clock: ManualClock

    @classmethod
    async def open(cls, tmp: Path) -> StoreEnv:
        db = await Database.open(tmp / "store.sqlite3")
        clock = ManualClock()
        authority = await LeaseRepository(db).try_acquire("leader-1", clock.now_ms(), LEASE_STALE_MS)
        assert authority is not None
        return cls(db, authority, clock)

    async def take_over(self, owner: str = "leader-2") -> Authority:
        """A successor takes the lease (the current one went stale); returns the old authority,
        which every unit of work now refuses."""
        old = self.authority
        self.clock.advance(LEASE_STALE_MS + 1)
        new = await LeaseRepository(self.db).try_acquire(owner, self.clock.now_ms(), LEASE_STALE_MS)
        assert new is not None and new.epoch == old.epoch + 1
        self.authority = new
        return old

    async def rows(self, table: str) -> list[dict]:
        """Every row of one table (a snapshot to compare before and after a refused write)."""
        return [dict(r) for r in await self.db.fetch_all(f"SELECT * FROM {table} ORDER BY 1")]
