"""Outbox: follower output accepted durably, posted to Telegram in order per topic."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from topicbus.storage.db import Authority, Database, UnitOfWork


@dataclass(frozen=True)
class OutboxItem:
    id: int
    binding_key: str
    chat_id: int
    thread_id: int | None
    kind: str
    payload: dict[str, Any]
    attempts: int


class OutboxRepository:
    def __init__(self, db: Database):
        self._db = db

    async def enqueue(self, *, binding_key: str, chat_id: int, thread_id: int | None, instance_id: str,
                      request_id: str, kind: str, payload: dict[str, Any], now_ms: int,
                      authority: Authority) -> tuple[int, bool]:
        """Store one item; idempotent per (instance_id, request_id). Returns (id, newly_added)."""
        async with self._db.unit_of_work(authority) as uow:
            row = await uow.fetch_one("SELECT id FROM outbox WHERE instance_id = ? AND request_id = ?",
                                     (instance_id, request_id))
            if row is not None:
                return row["id"], False
            new_id = await uow.insert(
                """INSERT INTO outbox (binding_key, chat_id, thread_id, instance_id, request_id, kind, payload,
                       created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
                (binding_key, chat_id, thread_id, instance_id, request_id, kind,
                 json.dumps(payload, separators=(",", ":")), now_ms),
            )
            return new_id, True

    async def pending(self, limit: int = 1000) -> list[OutboxItem]:
        rows = await self._db.fetch_all(
            "SELECT * FROM outbox WHERE status = 'pending' ORDER BY id LIMIT ?", (limit,))
        return [OutboxItem(r["id"], r["binding_key"], r["chat_id"], r["thread_id"], r["kind"],
                           json.loads(r["payload"]), r["attempts"]) for r in rows]

    async def mark_sent(self, item_id: int, now_ms: int, authority: Authority) -> None:
        async with self._db.unit_of_work(authority) as uow:
            await uow.execute("UPDATE outbox SET status = 'sent', sent_at_ms = ?, attempts = attempts + 1 WHERE id = ?",
                             (now_ms, item_id))

    async def mark_failed(self, item_id: int, error: str, authority: Authority) -> None:
        async with self._db.unit_of_work(authority) as uow:
            await uow.execute("UPDATE outbox SET status = 'failed', last_error = ?, attempts = attempts + 1 WHERE id = ?",
                             (error[:500], item_id))

    async def note_attempt(self, item_id: int, error: str, authority: Authority) -> None:
        async with self._db.unit_of_work(authority) as uow:
            await uow.execute("UPDATE outbox SET attempts = attempts + 1, last_error = ? WHERE id = ?",
                             (error[:500], item_id))

    @staticmethod
    async def retarget_tx(uow: UnitOfWork, binding_key: str, thread_id: int) -> None:
        """A binding got a new topic: its undelivered output goes there."""
        await uow.execute("UPDATE outbox SET thread_id = ? WHERE binding_key = ? AND status = 'pending'",
                             (thread_id, binding_key))

    async def count_pending(self) -> int:
        return int(await self._db.fetch_value("SELECT COUNT(*) FROM outbox WHERE status = 'pending'") or 0)

    async def pending_binding_keys(self) -> set[str]:
        rows = await self._db.fetch_all("SELECT DISTINCT binding_key FROM outbox WHERE status = 'pending'")
        return {r["binding_key"] for r in rows}

    async def purge_sent(self, older_than_ms: int, authority: Authority) -> int:
        async with self._db.unit_of_work(authority) as uow:
            return await uow.execute("DELETE FROM outbox WHERE status = 'sent' AND sent_at_ms < ?", (older_than_ms,))
