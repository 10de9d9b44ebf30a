"""Workspace bindings and their routeable owner records."""

from __future__ import annotations

import sqlite3

from topicbus.core.target import Target
from topicbus.core.bindings import Binding, OwnerRecord
from topicbus.storage.db import Database, UnitOfWork


def _binding(row: sqlite3.Row) -> Binding:
    data = dict(row)
    data["offline_notified"] = bool(data["offline_notified"])
    return Binding(**data)


def _owner(row: sqlite3.Row) -> OwnerRecord:
    return OwnerRecord(**dict(row))


class BindingRepository:
    def __init__(self, db: Database):
        self._db = db

    async def all(self) -> list[Binding]:
        return [_binding(r) for r in await self._db.fetch_all("SELECT * FROM workspace_bindings ORDER BY slot, binding_key")]

    async def get(self, binding_key: str) -> Binding | None:
        row = await self._db.fetch_one("SELECT * FROM workspace_bindings WHERE binding_key = ?", (binding_key,))
        return None if row is None else _binding(row)

    async def by_target(self, topic: Target) -> Binding | None:
        row = await self._db.fetch_one(
            "SELECT * FROM workspace_bindings WHERE chat_id = ? AND thread_id = ? AND topic_state != 'deleted'",
            (topic.chat_id, topic.thread_id),
        )
        return None if row is None else _binding(row)

    async def owners(self) -> list[OwnerRecord]:
        return [_owner(r) for r in await self._db.fetch_all("SELECT * FROM target_owners")]

    async def owner(self, binding_key: str) -> OwnerRecord | None:
        row = await self._db.fetch_one("SELECT * FROM target_owners WHERE binding_key = ?", (binding_key,))
        return None if row is None else _owner(row)

    # --- inside a write transaction ---------------------------------------------------------------
    @staticmethod
    async def get_tx(uow: UnitOfWork, binding_key: str) -> Binding | None:
        row = await uow.fetch_one("SELECT * FROM workspace_bindings WHERE binding_key = ?", (binding_key,))
        return None if row is None else _binding(row)

    @staticmethod
    async def delete_tx(uow: UnitOfWork, binding_key: str) -> None:
        """A retired binding: its slot letter is free again (rotation commit)."""
        await uow.execute("DELETE FROM workspace_bindings WHERE binding_key = ?", (binding_key,))

    @staticmethod
    async def slots_tx(uow: UnitOfWork) -> dict[str, str]:
        """binding key → slot letter, for every binding that holds a slot."""
        rows = await uow.fetch_all("SELECT binding_key, slot FROM workspace_bindings WHERE slot IS NOT NULL")
        return {r["binding_key"]: r["slot"] for r in rows}

    @staticmethod
    async def insert_tx(uow: UnitOfWork, b: Binding) -> None:
        await uow.execute(
            """INSERT INTO workspace_bindings (binding_key, kind, host_id, cwd, session, slot, chat_id, thread_id,
                   topic_state, thread_name, manual_name, display_title, inactive_since_ms, offline_notified,
                   created_at_ms, updated_at_ms)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (b.binding_key, b.kind, b.host_id, b.cwd, b.session, b.slot, b.chat_id, b.thread_id, b.topic_state,
             b.thread_name, b.manual_name, b.display_title, b.inactive_since_ms, int(b.offline_notified),
             b.created_at_ms, b.updated_at_ms),
        )

    @staticmethod
    async def set_topic_tx(uow: UnitOfWork, binding_key: str, *, thread_id: int, display_title: str | None,
                           now_ms: int) -> None:
        """Point a binding at a (re)created topic: open, active, title as created."""
        await uow.execute(
            """UPDATE workspace_bindings SET thread_id = ?, topic_state = 'open', display_title = ?,
                   inactive_since_ms = NULL, updated_at_ms = ? WHERE binding_key = ?""",
            (thread_id, display_title, now_ms, binding_key),
        )

    @staticmethod
    async def mark_active_tx(uow: UnitOfWork, binding_key: str) -> None:
        await uow.execute(
            "UPDATE workspace_bindings SET inactive_since_ms = NULL, offline_notified = 0 WHERE binding_key = ?",
            (binding_key,),
        )

    @staticmethod
    async def mark_inactive_tx(uow: UnitOfWork, binding_key: str, at_ms: int) -> bool:
        """Record the first proof that nobody owns this binding (first proof wins)."""
        changed = await uow.execute(
            "UPDATE workspace_bindings SET inactive_since_ms = ? WHERE binding_key = ? AND inactive_since_ms IS NULL",
            (at_ms, binding_key),
        )
        return changed > 0

    @staticmethod
    async def mark_topic_deleted_tx(uow: UnitOfWork, topic: Target, at_ms: int) -> str | None:
        """The topic is gone: the binding keeps slot and name, loses its owner, becomes inactive."""
        row = await uow.fetch_one(
            "SELECT binding_key FROM workspace_bindings WHERE chat_id = ? AND thread_id = ? AND topic_state != 'deleted'",
            (topic.chat_id, topic.thread_id),
        )
        if row is None:
            return None
        key = row["binding_key"]
        await uow.execute("UPDATE workspace_bindings SET topic_state = 'deleted' WHERE binding_key = ?", (key,))
        await uow.execute("DELETE FROM target_owners WHERE binding_key = ?", (key,))
        await BindingRepository.mark_inactive_tx(uow, key, at_ms)
        return key

    @staticmethod
    async def set_topic_state_tx(uow: UnitOfWork, binding_key: str, state: str) -> None:
        await uow.execute("UPDATE workspace_bindings SET topic_state = ? WHERE binding_key = ?", (state, binding_key))

    @staticmethod
    async def set_display_title_tx(uow: UnitOfWork, binding_key: str, title: str) -> None:
        await uow.execute("UPDATE workspace_bindings SET display_title = ? WHERE binding_key = ?", (title, binding_key))

    @staticmethod
    async def set_manual_name_tx(uow: UnitOfWork, binding_key: str, name: str) -> None:
        """The title an owner gave the topic in Telegram; every display mode keeps it."""
        await uow.execute("UPDATE workspace_bindings SET manual_name = ?, display_title = ? WHERE binding_key = ?",
                         (name, name, binding_key))

    @staticmethod
    async def set_offline_notified_tx(uow: UnitOfWork, binding_key: str) -> bool:
        changed = await uow.execute(
            "UPDATE workspace_bindings SET offline_notified = 1 WHERE binding_key = ? AND offline_notified = 0",
            (binding_key,),
        )
        return changed > 0

    @staticmethod
    async def owner_tx(uow: UnitOfWork, binding_key: str) -> OwnerRecord | None:
        row = await uow.fetch_one("SELECT * FROM target_owners WHERE binding_key = ?", (binding_key,))
        return None if row is None else _owner(row)

    @staticmethod
    async def set_owner_tx(uow: UnitOfWork, owner: OwnerRecord) -> None:
        await uow.execute(
            """INSERT INTO target_owners (binding_key, instance_id, registration_generation, pid, process_birth_id,
                   host_id, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (binding_key) DO UPDATE SET instance_id = excluded.instance_id,
                   registration_generation = excluded.registration_generation, pid = excluded.pid,
                   process_birth_id = excluded.process_birth_id, host_id = excluded.host_id,
                   updated_at_ms = excluded.updated_at_ms""",
            (owner.binding_key, owner.instance_id, owner.registration_generation, owner.pid,
             owner.process_birth_id, owner.host_id, owner.updated_at_ms),
        )

    @staticmethod
    async def detach_owner_tx(uow: UnitOfWork, expected: OwnerRecord) -> bool:
        """Compare-and-delete the exact owner record."""
        changed = await uow.execute(
            "DELETE FROM target_owners WHERE binding_key = ? AND instance_id = ? AND registration_generation = ?",
            (expected.binding_key, expected.instance_id, expected.registration_generation),
        )
        return changed > 0
