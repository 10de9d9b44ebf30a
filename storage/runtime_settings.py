"""Settings changed from Telegram (persisted; they win over the environment until reset)."""

from __future__ import annotations

from topicbus.core.authority import Authority
from topicbus.storage.db import Database


class RuntimeSettingsRepository:
    def __init__(self, db: Database):
        self._db = db

    async def get(self, key: str) -> str | None:
        return await self._db.fetch_value("SELECT value FROM runtime_settings WHERE key = ?", (key,))

    async def set(self, key: str, value: str, now_ms: int, authority: Authority) -> None:
        async with self._db.unit_of_work(authority) as uow:
            await uow.execute(
                """INSERT INTO runtime_settings (key, value, updated_at_ms) VALUES (?, ?, ?)
                   ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at_ms = excluded.updated_at_ms""",
                (key, value, now_ms),
            )

    async def reset(self, key: str, authority: Authority) -> None:
        async with self._db.unit_of_work(authority) as uow:
            await uow.execute("DELETE FROM runtime_settings WHERE key = ?", (key,))
