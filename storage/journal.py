"""Inbound journal: owner messages kept durably until the follower's receipt."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from topicbus.storage.db import Authority, AuthorityLost, Database

DELIVERY_PREFIX = "d-"


@dataclass(frozen=True)
class JournalItem:
    seq: int
    update_id: int
    binding_key: str
    payload: dict[str, Any]
    attempts: int

    @property
    def delivery_id(self) -> str:
        return f"{DELIVERY_PREFIX}{self.seq}"


def parse_delivery_id(delivery_id: str) -> int | None:
    if not delivery_id.startswith(DELIVERY_PREFIX):
        return None
    tail = delivery_id[len(DELIVERY_PREFIX):]
    return int(tail) if tail.isdigit() and len(tail) < 19 else None


class JournalRepository:
    def __init__(self, db: Database):
        self._db = db

    async def append(self, update_id: int, binding_key: str, payload: dict[str, Any], now_ms: int,
                     authority: Authority) -> JournalItem | None:
        """Journal one routed update; ``None`` when that update was already journaled."""
        added = await self.append_many([(update_id, binding_key, payload)], now_ms, authority)
        return added[0] if added else None

    async def append_many(self, rows: list[tuple[int, str, dict[str, Any]]], now_ms: int,
                          authority: Authority) -> list[JournalItem]:
        """Journal a batch of routed updates atomically; already journaled ones are skipped.

        One statement on the hot path: the rows, the duplicate check (``ON CONFLICT``) and the
        authority check (the lease row must still name this leader) commit or fail together."""
        rows = list({update_id: (update_id, key, payload) for update_id, key, payload in rows}.values())
        if not rows:
            return []
        values = ", ".join("(?, ?, ?, ?)" for _ in rows)
        params: list[Any] = []
        for update_id, binding_key, payload in rows:
            params += [update_id, binding_key, json.dumps(payload, separators=(",", ":")), now_ms]
        found = await self._db.self_fenced_statement(
            f"""INSERT INTO inbound_journal (update_id, binding_key, payload, created_at_ms)
                SELECT column1, column2, column3, column4 FROM (VALUES {values}) WHERE {{authority_check}}
                ON CONFLICT (update_id) DO NOTHING RETURNING seq, update_id""", params, authority)
        if not found and not await self._db.still_leader(authority):
            raise AuthorityLost("leader lease changed hands")
        seqs = {r["update_id"]: int(r["seq"]) for r in found}
        return sorted((JournalItem(seqs[u], u, k, p, 0) for u, k, p in rows if u in seqs), key=lambda i: i.seq)

    async def pending(self, binding_key: str, limit: int = 500, after_seq: int = 0) -> list[JournalItem]:
        rows = await self._db.fetch_all(
            """SELECT * FROM inbound_journal WHERE binding_key = ? AND status = 'pending' AND seq > ?
               ORDER BY seq LIMIT ?""",
            (binding_key, after_seq, limit),
        )
        return [JournalItem(r["seq"], r["update_id"], r["binding_key"], json.loads(r["payload"]), r["attempts"])
                for r in rows]

    async def mark_delivered(self, seq: int, binding_key: str, now_ms: int, authority: Authority) -> bool:
        return await self.mark_delivered_many([(seq, binding_key)], now_ms, authority) == 1

    async def mark_delivered_many(self, receipts: list[tuple[int, str]], now_ms: int, authority: Authority) -> int:
        """Apply follower receipts (seq, binding key) in one transaction; returns how many were new."""
        changed = 0
        async with self._db.unit_of_work(authority) as uow:
            for seq, binding_key in receipts:
                changed += await uow.execute(
                    """UPDATE inbound_journal SET status = 'delivered', delivered_at_ms = ?
                       WHERE seq = ? AND binding_key = ? AND status = 'pending'""",
                    (now_ms, seq, binding_key))
        return changed

    async def has_file(self, file_id: str) -> bool:
        """Whether a routed owner message carried this Telegram file."""
        needle = '%"fileId":' + json.dumps(file_id) + '%'
        return await self._db.fetch_value(
            "SELECT EXISTS (SELECT 1 FROM inbound_journal WHERE payload LIKE ? ESCAPE '\\')",
            (needle.replace("_", "\\_"),)) == 1

    async def count_pending(self) -> dict[str, int]:
        rows = await self._db.fetch_all(
            "SELECT binding_key, COUNT(*) AS n FROM inbound_journal WHERE status = 'pending' GROUP BY binding_key")
        return {r["binding_key"]: r["n"] for r in rows}

    async def purge_delivered(self, older_than_ms: int, authority: Authority) -> int:
        async with self._db.unit_of_work(authority) as uow:
            return await uow.execute(
                "DELETE FROM inbound_journal WHERE status = 'delivered' AND delivered_at_ms < ?", (older_than_ms,))
