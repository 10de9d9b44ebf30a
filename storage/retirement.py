"""Retirement intents: the durable "this exact inactive binding is being retired" fact."""

from __future__ import annotations

import json
from dataclasses import asdict

from topicbus.core.retirement import RetirementIntent
from topicbus.storage.bindings import Binding
from topicbus.storage.db import Database, UnitOfWork


class RetirementRepository:
    def __init__(self, db: Database):
        self._db = db

    async def all(self) -> list[RetirementIntent]:
        rows = await self._db.fetch_all("SELECT * FROM retirement_intents ORDER BY requested_at_ms, id")
        return [_intent(r) for r in rows]

    @staticmethod
    async def insert_tx(uow: UnitOfWork, intent: RetirementIntent) -> None:
        await uow.execute(
            """INSERT INTO retirement_intents (id, binding_key, binding_snapshot, slot, chat_id, thread_id,
                   leader_epoch, requested_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
            (intent.id, intent.binding_key, json.dumps(asdict(intent.binding)), intent.slot, intent.chat_id,
             intent.thread_id if intent.thread_id is not None else 0, intent.leader_epoch, intent.requested_at_ms))

    @staticmethod
    async def remove_tx(uow: UnitOfWork, intent_id: str) -> bool:
        return await uow.execute("DELETE FROM retirement_intents WHERE id = ?", (intent_id,)) > 0

    @staticmethod
    async def set_epoch_tx(uow: UnitOfWork, intent_id: str, epoch: int) -> None:
        await uow.execute("UPDATE retirement_intents SET leader_epoch = ? WHERE id = ?", (epoch, intent_id))


def _intent(row) -> RetirementIntent:
    snapshot = Binding(**json.loads(row["binding_snapshot"]))
    return RetirementIntent(id=row["id"], binding_key=row["binding_key"], binding=snapshot, slot=row["slot"],
                            chat_id=row["chat_id"], thread_id=row["thread_id"] or None,
                            leader_epoch=row["leader_epoch"], requested_at_ms=row["requested_at_ms"])
