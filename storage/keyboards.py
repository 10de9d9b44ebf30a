"""Inline keyboards: the buttons the leader put under its messages, kept so that a press can be served.

Telegram hands back only a button's ``callback_data`` (at most 64 bytes); each button carries
``k:<token>:<index>`` and the row here says what it means: whose output it is under, which follower
process and registration it belongs to, the follower's data, and — for a follower's buttons — the
one press that answered it.

Two columns hold JSON, each read and written here only: ``buttons`` (rows of ``{"text", "data"}``,
read as :class:`~topicbus.core.records.Button` rows) and ``shown_text`` (the answered message as it is
to be shown: its text and entities, read as a :class:`~topicbus.core.formatting.Rendered`).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from topicbus.core.formatting import Entity, Rendered
from topicbus.core.records import Button
from topicbus.core.keyboards import INTERRUPT, Keyboard
from topicbus.core.authority import Authority
from topicbus.storage.db import Database, UnitOfWork

TOKEN_BYTES = 12  # 96 random bits, 16 URL-safe characters


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def _keyboard(r: Any) -> Keyboard:
    presses = r["takes_presses"]
    return Keyboard(r["token"], r["kind"], r["outbox_id"], r["binding_key"], r["instance_id"],
                    r["registration_generation"], None if presses is None else bool(presses), r["chat_id"],
                    r["thread_id"], r["message_id"], _buttons_of(r["buttons"]), r["created_at_ms"],
                    r["answered_update_id"], r["answered_index"], r["answered_by"], r["answered_at_ms"],
                    _shown_of(r["shown_text"]), r["shown_at_ms"])


def _buttons_json(buttons: tuple[tuple[Button, ...], ...]) -> str:
    return json.dumps([[{"text": b.text, "data": b.data} for b in row] for row in buttons], separators=(",", ":"),
                      ensure_ascii=False)


def _buttons_of(text: str) -> tuple[tuple[Button, ...], ...]:
    return tuple(tuple(Button(str(b["text"]), str(b["data"])) for b in row) for row in json.loads(text))


def _shown_json(shown: Rendered | None) -> str | None:
    if shown is None:
        return None
    return json.dumps({"text": shown.text, "entities": [{"type": e.type, "offset": e.offset, "length": e.length,
                                                         "language": e.language, "url": e.url}
                                                        for e in shown.entities]},
                      separators=(",", ":"), ensure_ascii=False)


def _shown_of(text: str | None) -> Rendered | None:
    stored = json.loads(text) if text else None
    if not stored:
        return None
    return Rendered(stored["text"], tuple(Entity(**e) for e in stored.get("entities") or []))


class KeyboardRepository:
    def __init__(self, db: Database):
        self._db = db

    async def get(self, token: str) -> Keyboard | None:
        row = await self._db.fetch_one("SELECT * FROM inline_keyboards WHERE token = ?", (token,))
        return None if row is None else _keyboard(row)

    async def make(self, *, kind: str, outbox_id: int, binding_key: str, instance_id: str, generation: str,
                   takes_presses: bool | None, chat_id: int, thread_id: int | None,
                   buttons: tuple[tuple[Button, ...], ...], now_ms: int, authority: Authority) -> Keyboard:
        """The keyboard of one output row: made once, and the same one when that row goes out again
        (its message may have been sent before a crash). An Interrupt keyboard follows the
        registration that is live now."""
        async with self._db.unit_of_work(authority) as uow:
            row = await uow.fetch_one("SELECT * FROM inline_keyboards WHERE outbox_id = ? AND kind = ?",
                                      (outbox_id, kind))
            if row is not None:
                found = _keyboard(row)
                if kind == INTERRUPT and found.registration_generation != generation:
                    await uow.execute("UPDATE inline_keyboards SET registration_generation = ?, instance_id = ? "
                                      "WHERE token = ?", (generation, instance_id, found.token))
                    return await self._reread(uow, found.token)
                return found
            token = new_token()
            await uow.execute(
                """INSERT INTO inline_keyboards (token, kind, outbox_id, binding_key, instance_id,
                       registration_generation, takes_presses, chat_id, thread_id, buttons, created_at_ms)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (token, kind, outbox_id, binding_key, instance_id, generation,
                 None if takes_presses is None else int(takes_presses), chat_id, thread_id,
                 _buttons_json(buttons), now_ms))
            return await self._reread(uow, token)

    @staticmethod
    async def _reread(uow: UnitOfWork, token: str) -> Keyboard:
        row = await uow.fetch_one("SELECT * FROM inline_keyboards WHERE token = ?", (token,))
        assert row is not None
        return _keyboard(row)

    async def set_message(self, token: str, message_id: int, authority: Authority) -> None:
        """Telegram accepted the message that carries this keyboard."""
        async with self._db.unit_of_work(authority) as uow:
            await uow.execute("UPDATE inline_keyboards SET message_id = ? WHERE token = ?", (message_id, token))

    @staticmethod
    async def claim_tx(uow: UnitOfWork, token: str, *, update_id: int, index: int, user_id: int, now_ms: int,
                       message_id: int | None, shown: Rendered | None) -> bool:
        """Record the press that answers a choice keyboard, and the message as it is to be shown;
        False when another press did already."""
        return await uow.execute(
            """UPDATE inline_keyboards SET answered_update_id = ?, answered_index = ?, answered_by = ?,
                   answered_at_ms = ?, shown_text = ?, message_id = COALESCE(message_id, ?)
               WHERE token = ? AND answered_update_id IS NULL""",
            (update_id, index, user_id, now_ms,
             _shown_json(shown), message_id, token)) == 1

    async def mark_shown(self, token: str, now_ms: int, authority: Authority) -> None:
        async with self._db.unit_of_work(authority) as uow:
            await uow.execute("UPDATE inline_keyboards SET shown_at_ms = ? WHERE token = ? AND shown_at_ms IS NULL",
                              (now_ms, token))

    async def unshown(self, since_ms: int) -> list[Keyboard]:
        """Answered keyboards whose message does not show the choice yet (answered after ``since_ms``)."""
        rows = await self._db.fetch_all(
            """SELECT * FROM inline_keyboards WHERE answered_at_ms IS NOT NULL AND shown_at_ms IS NULL
               AND answered_at_ms >= ? ORDER BY answered_at_ms""", (since_ms,))
        return [_keyboard(r) for r in rows]

    async def purge(self, older_than_ms: int, authority: Authority) -> int:
        async with self._db.unit_of_work(authority) as uow:
            return await uow.execute("DELETE FROM inline_keyboards WHERE created_at_ms < ?", (older_than_ms,))
