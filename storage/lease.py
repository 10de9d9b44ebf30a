"""The leader lease row: who leads, under which epoch, last refreshed when."""

from __future__ import annotations

from dataclasses import dataclass

from topicbus.core.authority import Authority
from topicbus.storage.db import Database


@dataclass(frozen=True)
class LeaseState:
    owner: str
    epoch: int
    heartbeat_at_ms: int


class LeaseRepository:
    def __init__(self, db: Database):
        self._db = db

    async def current(self) -> LeaseState | None:
        row = await self._db.fetch_one("SELECT owner, epoch, heartbeat_at_ms FROM leader_lease WHERE id = 1")
        return None if row is None else LeaseState(row["owner"], row["epoch"], row["heartbeat_at_ms"])

    async def try_acquire(self, owner: str, now_ms: int, stale_after_ms: int) -> Authority | None:
        """Take the lease when it is free or stale; every acquisition mints a new epoch."""
        async with self._db.lease_transaction() as uow:
            row = await uow.fetch_one("SELECT owner, epoch, heartbeat_at_ms FROM leader_lease WHERE id = 1")
            if row is None:
                epoch = 1
                await uow.execute("INSERT INTO leader_lease (id, owner, epoch, heartbeat_at_ms) VALUES (1, ?, ?, ?)",
                                 (owner, epoch, now_ms))
                return Authority(owner, epoch)
            if row["owner"] != owner and now_ms - row["heartbeat_at_ms"] <= stale_after_ms:
                return None
            epoch = row["epoch"] + 1
            await uow.execute("UPDATE leader_lease SET owner = ?, epoch = ?, heartbeat_at_ms = ? WHERE id = 1",
                             (owner, epoch, now_ms))
            return Authority(owner, epoch)

    async def refresh(self, authority: Authority, now_ms: int) -> bool:
        """Renew the heartbeat. One busy wait at most: the refresh job runs again at its next tick,
        and meanwhile the journal and every other writer get their turn at the write lock."""
        async with self._db.lease_transaction(attempts=1) as uow:
            changed = await uow.execute(
                "UPDATE leader_lease SET heartbeat_at_ms = ? WHERE id = 1 AND owner = ? AND epoch = ?",
                (now_ms, authority.owner, authority.epoch),
            )
            return changed > 0

    async def release(self, authority: Authority) -> None:
        """Give the lease up at graceful shutdown so a standby takes over at once."""
        async with self._db.lease_transaction() as uow:
            await uow.execute(
                "UPDATE leader_lease SET heartbeat_at_ms = 0 WHERE id = 1 AND owner = ? AND epoch = ?",
                (authority.owner, authority.epoch),
            )
