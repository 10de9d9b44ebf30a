"""Outbox: output accepted durably (agents' and the leader's own), posted to Telegram in order per topic.

The scheduler never loads a payload it is not about to send: it reads per-topic summaries and
*heads* (id, kind, priority, size, format), then the payloads of the rows one Telegram message
will carry. The rows one message covers are marked sent together, after Telegram accepted it.

A row's payload is its outbox item (``core/records``): the row's ``kind`` says which (``text``,
``chatAction``, ``document``, ``photo``, ``notice``: the stored names every release has written) and
its ``payload`` column holds the rest as JSON, in the shape of the follower's ``follower.send``
message (``{"text": …, "format": …}``, ``{"fileName": …, "dataBase64": …}``; a notice's
``{"text": …, "replyTo": …}``). :func:`item_row` and :func:`item_of` are that shape's one converter
each way; a kind is read as the item's ``type`` (``chatAction`` as ``chat_action``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from topicbus.core.target import Target
from topicbus.core.output import TopicBacklog
from topicbus.core.budget import Priority
from topicbus.core.output import QueuedItem
from topicbus.core.records import (Button, ChatActionMessage, DocumentMessage, Notice, OutboxItem, PhotoMessage,
                                   TextMessage)
from topicbus.core.authority import Authority
from topicbus.storage.db import Database, UnitOfWork

#: An item's ``type`` → the ``kind`` its row stores (the same name, but for chat actions).
_STORED_KINDS = {ChatActionMessage.type: "chatAction"}
_KINDS = {stored: kind for kind, stored in _STORED_KINDS.items()}


def _kind(stored: str) -> str:
    """A row's ``kind`` as an item type (a :class:`~topicbus.core.output.QueuedItem`'s kind)."""
    return _KINDS.get(stored, stored)


# --- the stored shape of an item, one converter each way -------------------------------------------
def item_row(item: OutboxItem) -> tuple[str, str]:
    """(the row's ``kind``, its ``payload`` JSON) for an item."""
    body: dict[str, Any]
    if isinstance(item, TextMessage):
        body = {"text": item.text}
        if item.format is not None:
            body["format"] = item.format
        if item.buttons:
            body["buttons"] = [[{"text": b.text, "data": b.data} for b in row] for row in item.buttons]
        if item.tail:
            body["tail"] = True
        if item.screen:
            body["screen"] = True
    elif isinstance(item, Notice):
        body = {"text": item.text}
        if item.reply_to is not None:
            body["replyTo"] = item.reply_to
    elif isinstance(item, ChatActionMessage):
        body = {"action": item.action}
    else:
        body = {"fileName": item.file_name, "dataBase64": base64.b64encode(item.data).decode("ascii")}
        if item.caption is not None:
            body["caption"] = item.caption
    return _STORED_KINDS.get(item.type, item.type), json.dumps(body, separators=(",", ":"))


def item_of(stored: str, payload: str) -> OutboxItem | None:
    """The item a row of kind ``stored`` holds; None for a kind this version does not know."""
    raw = json.loads(payload)
    kind = _kind(stored)
    if kind == TextMessage.type:
        buttons = tuple(tuple(Button(str(b.get("text")), str(b.get("data"))) for b in row if isinstance(b, dict))
                        for row in raw.get("buttons") or () if isinstance(row, list))
        return TextMessage(raw.get("text") or "", raw.get("format"), buttons, bool(raw.get("tail")),
                           bool(raw.get("screen")))
    if kind == Notice.type:
        reply_to = raw.get("replyTo")
        return Notice(raw.get("text") or "", reply_to if isinstance(reply_to, int) else None)
    if kind == ChatActionMessage.type:
        return ChatActionMessage(raw.get("action") or "typing")
    if kind in (DocumentMessage.type, PhotoMessage.type):
        file = PhotoMessage if kind == PhotoMessage.type else DocumentMessage
        return file(raw.get("fileName") or "file", base64.b64decode(raw.get("dataBase64") or "", validate=False),
                    raw.get("caption"))
    return None




class OutboxRepository:
    def __init__(self, db: Database):
        self._db = db

    async def enqueue(self, *, binding_key: str, chat_id: int, thread_id: int | None, instance_id: str,
                      request_id: str, item: OutboxItem, now_ms: int, authority: Authority,
                      priority: Priority = Priority.OUTPUT, units: int = 0, fmt: str | None = None,
                      has_buttons: bool = False) -> tuple[int, bool]:
        """Store one item; idempotent per (instance_id, request_id). Returns (id, newly_added)."""
        async with self._db.unit_of_work(authority) as uow:
            return await self.enqueue_tx(uow, binding_key=binding_key, chat_id=chat_id, thread_id=thread_id,
                                         instance_id=instance_id, request_id=request_id, item=item,
                                         now_ms=now_ms, priority=priority, units=units, fmt=fmt,
                                         has_buttons=has_buttons)

    @staticmethod
    async def enqueue_tx(uow: UnitOfWork, *, binding_key: str, chat_id: int, thread_id: int | None,
                         instance_id: str, request_id: str, item: OutboxItem, now_ms: int,
                         priority: Priority = Priority.OUTPUT, units: int = 0, fmt: str | None = None,
                         has_buttons: bool = False) -> tuple[int, bool]:
        """:meth:`enqueue` inside a caller's unit of work (with what must commit with it)."""
        kind, body = item_row(item)
        row = await uow.fetch_one("SELECT id FROM outbox WHERE instance_id = ? AND request_id = ?",
                                  (instance_id, request_id))
        if row is not None:
            return row["id"], False
        new_id = await uow.insert(
            """INSERT INTO outbox (binding_key, chat_id, thread_id, instance_id, request_id, kind, priority, units,
                   bytes, format, has_buttons, payload, created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (binding_key, chat_id, thread_id, instance_id, request_id, kind, int(priority), units, len(body), fmt,
             int(has_buttons), body, now_ms),
        )
        return new_id, True

    # --- what the scheduler reads -------------------------------------------------------------------
    async def topics(self) -> list[TopicBacklog]:
        rows = await self._db.fetch_all(
            """SELECT chat_id, thread_id, COUNT(*) AS items, SUM(units) AS units, MIN(id) AS head_id
               FROM outbox WHERE status = 'pending' GROUP BY chat_id, thread_id""")
        return [TopicBacklog(r["chat_id"], r["thread_id"], r["items"], r["units"] or 0, r["head_id"]) for r in rows]

    async def heads(self, topic: Target, limit: int = 256) -> list[QueuedItem]:
        """The oldest pending rows of one topic, without their payloads (a screen frame is told by its
        payload's ``screen`` field: screen-frames-v1)."""
        rows = await self._db.fetch_all(
            """SELECT id, kind, priority, units, format, has_buttons, created_at_ms,
                      kind = 'text' AND json_extract(payload, '$.screen') = 1 AS screen FROM outbox
               WHERE status = 'pending' AND chat_id = ? AND thread_id IS ? ORDER BY id LIMIT ?""",
            (topic.chat_id, topic.thread_id, limit))
        return [QueuedItem(r["id"], _kind(r["kind"]), r["units"], r["format"], Priority(r["priority"]),
                           arrived_ms=r["created_at_ms"], has_buttons=bool(r["has_buttons"]),
                           screen=bool(r["screen"])) for r in rows]

    @staticmethod
    def item_size(item: OutboxItem) -> int:
        """The bytes an item's payload takes in its row (what the backlog cap counts)."""
        return len(item_row(item)[1])

    async def payloads(self, ids: Sequence[int]) -> dict[int, OutboxItem]:
        """The items of these rows (a row gone, or of a kind this version does not know, is left out)."""
        if not ids:
            return {}
        marks = ", ".join("?" for _ in ids)
        rows = await self._db.fetch_all(f"SELECT id, kind, payload FROM outbox WHERE id IN ({marks})", list(ids))
        return {r["id"]: item for r in rows if (item := item_of(r["kind"], r["payload"])) is not None}

    async def origin(self, item_id: int) -> tuple[str, str, str] | None:
        """(binding key, instance id, kind) of one row: whose output it is."""
        row = await self._db.fetch_one("SELECT binding_key, instance_id, kind FROM outbox WHERE id = ?", (item_id,))
        return None if row is None else (row["binding_key"], row["instance_id"], _kind(row["kind"]))

    async def backlog_of(self, binding_key: str) -> tuple[int, int]:
        """(pending items, pending payload bytes) of one binding."""
        row = await self._db.fetch_one(
            "SELECT COUNT(*) AS items, SUM(bytes) AS bytes FROM outbox WHERE status = 'pending' AND binding_key = ?",
            (binding_key,))
        return (row["items"], row["bytes"] or 0) if row is not None else (0, 0)

    async def backlog_by_binding(self) -> dict[str, tuple[int, int]]:
        """binding key → (pending items, pending payload bytes)."""
        rows = await self._db.fetch_all(
            """SELECT binding_key, COUNT(*) AS items, SUM(bytes) AS bytes FROM outbox WHERE status = 'pending'
               GROUP BY binding_key""")
        return {r["binding_key"]: (r["items"], r["bytes"] or 0) for r in rows}

    # --- outcomes ---------------------------------------------------------------------------------
    async def mark_sent(self, ids: Sequence[int], now_ms: int, message_id: int | None, authority: Authority) -> None:
        """The rows one Telegram message (or edit, or file) carried: sent, together."""
        marks = ", ".join("?" for _ in ids)
        async with self._db.unit_of_work(authority) as uow:
            await uow.execute(
                f"""UPDATE outbox SET status = 'sent', sent_at_ms = ?, message_id = ?, attempts = attempts + 1
                    WHERE id IN ({marks}) AND status = 'pending'""", (now_ms, message_id, *ids))

    async def mark_failed(self, item_id: int, error: str, authority: Authority) -> None:
        async with self._db.unit_of_work(authority) as uow:
            await uow.execute("UPDATE outbox SET status = 'failed', last_error = ?, attempts = attempts + 1 "
                              "WHERE id = ? AND status = 'pending'", (error[:500], item_id))

    async def note_attempt(self, item_id: int, error: str, authority: Authority) -> None:
        async with self._db.unit_of_work(authority) as uow:
            await uow.execute("UPDATE outbox SET attempts = attempts + 1, last_error = ? WHERE id = ?",
                              (error[:500], item_id))

    async def fail_unbound(self, topic: Target, error: str, authority: Authority) -> int:
        """The topic is gone and no binding will ever take these rows to a new one (a hint outside
        agent topics, the output of a forgotten binding): they fail instead of waiting for ever."""
        async with self._db.unit_of_work(authority) as uow:
            return await uow.execute(
                """UPDATE outbox SET status = 'failed', last_error = ?, attempts = attempts + 1
                   WHERE chat_id = ? AND thread_id = ? AND status = 'pending'
                     AND binding_key NOT IN (SELECT binding_key FROM workspace_bindings)""",
                (error[:500], topic.chat_id, topic.thread_id))

    @staticmethod
    async def retarget_tx(uow: UnitOfWork, binding_key: str, thread_id: int) -> int:
        """A binding got a new topic: its undelivered output goes there. Returns the rows moved."""
        return await uow.execute("UPDATE outbox SET thread_id = ? WHERE binding_key = ? AND status = 'pending'",
                          (thread_id, binding_key))

    async def pending_in(self, topic: Target) -> int:
        """Rows still to go out into one topic (a topic is closed or deleted only at 0)."""
        return int(await self._db.fetch_value(
            "SELECT COUNT(*) FROM outbox WHERE status = 'pending' AND chat_id = ? AND thread_id = ?",
            (topic.chat_id, topic.thread_id)) or 0)

    async def count_pending(self) -> int:
        return int(await self._db.fetch_value("SELECT COUNT(*) FROM outbox WHERE status = 'pending'") or 0)

    async def pending_binding_keys(self) -> set[str]:
        rows = await self._db.fetch_all("SELECT DISTINCT binding_key FROM outbox WHERE status = 'pending'")
        return {r["binding_key"] for r in rows}

    async def purge_sent(self, older_than_ms: int, authority: Authority) -> int:
        async with self._db.unit_of_work(authority) as uow:
            return await uow.execute("DELETE FROM outbox WHERE status = 'sent' AND sent_at_ms < ?", (older_than_ms,))
