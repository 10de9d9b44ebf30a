"""Cleanups of finished agents' topics.

* :class:`ScheduledCleanup` — a topic kept readable for its grace period; when it falls due and
  nobody took the workspace back, it becomes
* :class:`CleanupIntent` — durable destructive intent, written before any Telegram close/delete.
"""

from __future__ import annotations


from topicbus.core.cleanups import CleanupIntent, ScheduledCleanup
from topicbus.storage.db import Database, UnitOfWork


class CleanupRepository:
    def __init__(self, db: Database):
        self._db = db

    async def all(self) -> list[CleanupIntent]:
        rows = await self._db.fetch_all("SELECT * FROM pending_cleanups ORDER BY requested_at_ms, id")
        return [CleanupIntent(**dict(r)) for r in rows]

    @staticmethod
    async def upsert_tx(uow: UnitOfWork, intent: CleanupIntent) -> None:
        await uow.execute(
            """INSERT INTO pending_cleanups (id, binding_key, instance_id, registration_generation, chat_id, thread_id,
                   reason, requested_at_ms, last_error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (id) DO NOTHING""",
            (intent.id, intent.binding_key, intent.instance_id, intent.registration_generation, intent.chat_id,
             intent.thread_id, intent.reason, intent.requested_at_ms, intent.last_error),
        )

    @staticmethod
    async def remove_tx(uow: UnitOfWork, intent_id: str) -> None:
        await uow.execute("DELETE FROM pending_cleanups WHERE id = ?", (intent_id,))

    @staticmethod
    async def note_error_tx(uow: UnitOfWork, intent_id: str, error: str) -> None:
        await uow.execute("UPDATE pending_cleanups SET last_error = ? WHERE id = ?", (error[:500], intent_id))


class ScheduledCleanupRepository:
    def __init__(self, db: Database):
        self._db = db

    async def all(self) -> list[ScheduledCleanup]:
        rows = await self._db.fetch_all("SELECT * FROM scheduled_cleanups ORDER BY due_at_ms, binding_key")
        return [ScheduledCleanup(**dict(r)) for r in rows]

    async def get(self, binding_key: str) -> ScheduledCleanup | None:
        row = await self._db.fetch_one("SELECT * FROM scheduled_cleanups WHERE binding_key = ?", (binding_key,))
        return None if row is None else ScheduledCleanup(**dict(row))

    @staticmethod
    async def put_tx(uow: UnitOfWork, cleanup: ScheduledCleanup) -> None:
        """Schedule (or re-schedule: one row per binding, the later departure wins)."""
        await uow.execute(
            """INSERT OR REPLACE INTO scheduled_cleanups (binding_key, instance_id, registration_generation, chat_id,
                   thread_id, reason, requested_at_ms, due_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
            (cleanup.binding_key, cleanup.instance_id, cleanup.registration_generation, cleanup.chat_id,
             cleanup.thread_id, cleanup.reason, cleanup.requested_at_ms, cleanup.due_at_ms))

    @staticmethod
    async def remove_tx(uow: UnitOfWork, binding_key: str) -> None:
        await uow.execute("DELETE FROM scheduled_cleanups WHERE binding_key = ?", (binding_key,))
