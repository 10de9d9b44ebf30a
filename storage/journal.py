"""Inbound journal: owner messages kept durably until the follower's receipt.

A row's ``status``: ``pending`` (waits for its follower's receipt), ``gathering`` (held back: an album
part waiting for the rest of its album, or — without a media group — a voice note waiting for its
transcript; delivery stops there so that order is kept), and the settled
states ``delivered``, ``merged`` (an album part folded into its album's first row), ``skipped`` (the
follower does not take that delivery type, or a button press meant for an earlier process),
``dropped`` (``/drop``) and ``expired`` (older than the offline TTL). ``delivered_at_ms`` is when a
row was settled, whichever way.

A row with ``for_instance`` (a button press) is generation-bound: only that follower process gets
it, also after it reconnects; a successor never does.

A row's ``payload`` is its inbound item (``core/records``), stored as JSON in the shape every release
has written (the protocol's version 1 item: ``{"type": "message", "messageId": …}``), so rows written
by 0.2 and 0.3 read as they are, and a leader of those releases taking over reads the rows of this
one. :func:`item_json` and :func:`item_of` are that shape's one converter each way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

from topicbus.core.records import (ButtonItem, ControlItem, DocumentRef, EditItem, FileRef, InboundItem, MediaItem,
                                   MessageItem, ReplyContext, UnknownItem)
from topicbus.core.journal import SETTLED, JournalItem, JournalRow
from topicbus.core.authority import Authority, AuthorityLost
from topicbus.storage.db import Database, UnitOfWork

_CHUNK = 400  # bound parameters per statement, well below SQLite's limit


def _item(r: Any) -> JournalItem:
    return JournalItem(r["seq"], r["update_id"], r["binding_key"], item_of(r["payload"]), r["attempts"],
                       r["created_at_ms"], r["status"], r["media_group"], r["for_instance"])


def _dump(payload: InboundItem) -> str:
    return json.dumps(item_json(payload), separators=(",", ":"))


# --- the stored shape of an item, one converter each way -------------------------------------------
def item_json(item: InboundItem) -> dict[str, Any]:
    """An item as its row stores it: every field of its type, absent ones as null (a message's
    ``transcribedFrom`` only when it has one)."""
    if isinstance(item, MessageItem):
        stored = {"type": "message", "text": item.text, "caption": item.caption, "messageId": item.message_id,
                  "fromUserId": item.from_user_id, "fromName": item.from_name, "date": item.date,
                  "document": None if item.document is None else _document_json(item.document),
                  "reply": None if item.reply is None else _reply_json(item.reply)}
        if item.transcribed_from is not None:
            stored["transcribedFrom"] = _file_json(item.transcribed_from)
        return stored
    if isinstance(item, MediaItem):
        return {"type": "media", "files": [_file_json(f) for f in item.files], "caption": item.caption,
                "messageId": item.message_id, "fromUserId": item.from_user_id, "fromName": item.from_name,
                "date": item.date, "reply": None if item.reply is None else _reply_json(item.reply)}
    if isinstance(item, EditItem):
        return {"type": "edit", "messageId": item.message_id, "text": item.text}
    if isinstance(item, ControlItem):
        return {"type": "control", "action": item.action, "messageId": item.message_id}
    if isinstance(item, ButtonItem):
        return {"type": "button", "data": item.data, "messageId": item.message_id, "fromUserId": item.from_user_id}
    return {"type": item.type}


def item_of(text: str) -> InboundItem:
    """The item a row stores, whichever release wrote it (a field it lacks reads as absent, one it
    does not know is ignored; a type this version does not know is an :class:`UnknownItem`)."""
    raw = json.loads(text)
    kind = raw.get("type")
    if kind == "message":
        document, transcribed = raw.get("document"), raw.get("transcribedFrom")
        return MessageItem(text=raw.get("text"), caption=raw.get("caption"), message_id=raw.get("messageId"),
                           from_user_id=raw.get("fromUserId"), from_name=raw.get("fromName"), date=raw.get("date"),
                           document=_document_of(document) if isinstance(document, dict) else None,
                           reply=_reply_of(raw.get("reply")),
                           transcribed_from=_file_of(transcribed) if isinstance(transcribed, dict) else None)
    if kind == "media":
        return MediaItem(files=tuple(_file_of(f) for f in raw.get("files") or () if isinstance(f, dict)),
                         caption=raw.get("caption"), message_id=raw.get("messageId"),
                         from_user_id=raw.get("fromUserId"), from_name=raw.get("fromName"), date=raw.get("date"),
                         reply=_reply_of(raw.get("reply")))
    if kind == "edit":
        return EditItem(message_id=raw.get("messageId"), text=raw.get("text"))
    if kind == "control":
        return ControlItem(action=raw.get("action"), message_id=raw.get("messageId"))
    if kind == "button":
        return ButtonItem(data=raw.get("data"), message_id=raw.get("messageId"), from_user_id=raw.get("fromUserId"))
    return UnknownItem(str(kind))


def _document_json(document: DocumentRef) -> dict[str, Any]:
    return {"fileId": document.file_id, "fileName": document.file_name, "mimeType": document.mime_type,
            "fileSize": document.file_size}


def _document_of(raw: dict[str, Any]) -> DocumentRef:
    return DocumentRef(file_id=raw.get("fileId"), file_name=raw.get("fileName"), mime_type=raw.get("mimeType"),
                       file_size=raw.get("fileSize"))


def _file_json(file: FileRef) -> dict[str, Any]:
    return {"fileId": file.file_id, "fileName": file.file_name, "mimeType": file.mime_type,
            "fileSize": file.file_size, "kind": file.kind, "duration": file.duration, "tooLarge": file.too_large}


def _file_of(raw: dict[str, Any]) -> FileRef:
    return FileRef(file_id=raw.get("fileId"), file_name=raw.get("fileName"), mime_type=raw.get("mimeType"),
                   file_size=raw.get("fileSize"), kind=raw.get("kind") or "document", duration=raw.get("duration"),
                   too_large=bool(raw.get("tooLarge")))


def _reply_json(reply: ReplyContext) -> dict[str, Any]:
    return {"messageId": reply.message_id, "text": reply.text, "fromName": reply.from_name,
            "fromAgent": reply.from_agent, "quote": reply.quote}


def _reply_of(raw: object) -> ReplyContext | None:
    if not isinstance(raw, dict):
        return None
    return ReplyContext(message_id=raw.get("messageId"), text=raw.get("text"), from_name=raw.get("fromName"),
                        from_agent=bool(raw.get("fromAgent")), quote=raw.get("quote"))


class JournalRepository:
    def __init__(self, db: Database):
        self._db = db

    async def append(self, update_id: int, binding_key: str, payload: InboundItem, now_ms: int,
                     authority: Authority) -> JournalItem | None:
        """Journal one routed update; ``None`` when that update was already journaled."""
        added = await self.append_many([(update_id, binding_key, payload)], now_ms, authority)
        return added[0] if added else None

    async def append_many(self, rows: Sequence[JournalRow], now_ms: int, authority: Authority, *,
                          held: Collection[int] = ()) -> list[JournalItem]:
        """Journal a batch of routed updates atomically; already journaled ones are skipped. A row
        with a media group (an album part) is journaled as ``gathering``, and so is a row whose update
        id is in ``held`` (a voice note to transcribe, see :meth:`release_held_tx`).

        One statement on the hot path: the rows, the duplicate check (``ON CONFLICT``) and the
        authority check (the lease row must still name this leader) commit or fail together."""
        unique: dict[int, tuple[int, str, InboundItem, str | None]] = {}
        for row in rows:
            update_id, key, payload = row[0], row[1], row[2]
            unique[update_id] = (update_id, key, payload, row[3] if len(row) > 3 else None)
        if not unique:
            return []
        values = ", ".join("(?, ?, ?, ?, ?, ?)" for _ in unique)
        params: list[Any] = []
        for update_id, binding_key, payload, group in unique.values():
            params += [update_id, binding_key, _dump(payload), now_ms,
                       "gathering" if group or update_id in held else "pending", group]
        found = await self._db.self_fenced_statement(
            f"""INSERT INTO inbound_journal (update_id, binding_key, payload, created_at_ms, status, media_group)
                SELECT column1, column2, column3, column4, column5, column6 FROM (VALUES {values})
                WHERE {{authority_check}}
                ON CONFLICT (update_id) DO NOTHING RETURNING seq, update_id""", params, authority)
        if not found and not await self._db.still_leader(authority):
            raise AuthorityLost("leader lease changed hands")
        seqs = {r["update_id"]: int(r["seq"]) for r in found}
        return sorted((JournalItem(seqs[u], u, k, p, 0, now_ms, "gathering" if g or u in held else "pending", g)
                       for u, k, p, g in unique.values() if u in seqs), key=lambda i: i.seq)

    @staticmethod
    async def append_tx(uow: UnitOfWork, update_id: int, binding_key: str, payload: InboundItem, now_ms: int, *,
                        for_instance: str | None = None) -> JournalItem | None:
        """Journal one routed update inside a caller's unit of work (with what must commit with it);
        ``None`` when that update was already journaled. ``for_instance``: the row is generation-bound
        and goes to that follower process only."""
        rows = await uow.fetch_all(
            """INSERT INTO inbound_journal (update_id, binding_key, payload, created_at_ms, status, for_instance)
               VALUES (?, ?, ?, ?, 'pending', ?) ON CONFLICT (update_id) DO NOTHING RETURNING seq""",
            (update_id, binding_key, _dump(payload), now_ms, for_instance))
        if not rows:
            return None
        return JournalItem(int(rows[0]["seq"]), update_id, binding_key, payload, 0, now_ms, "pending", None,
                           for_instance)

    async def pending(self, binding_key: str, limit: int = 500, after_seq: int = 0) -> list[JournalItem]:
        """Rows that wait for this binding's follower, in journal order (album parts still
        gathering included: delivery stops at them)."""
        rows = await self._db.fetch_all(
            """SELECT * FROM inbound_journal WHERE binding_key = ? AND status IN ('pending', 'gathering')
               AND seq > ? ORDER BY seq LIMIT ?""",
            (binding_key, after_seq, limit),
        )
        return [_item(r) for r in rows]

    async def mark_delivered(self, seq: int, binding_key: str, now_ms: int, authority: Authority) -> bool:
        return await self.mark_delivered_many([(seq, binding_key)], now_ms, authority) == 1

    async def mark_delivered_many(self, receipts: list[tuple[int, str]], now_ms: int, authority: Authority) -> int:
        """Apply follower receipts (seq, binding key) in one transaction; returns how many were new."""
        return len(await self.settle_receipts(receipts, now_ms, authority))

    async def settle_receipts(self, receipts: Sequence[tuple[int, str]], now_ms: int,
                              authority: Authority) -> list[JournalItem]:
        """Apply follower receipts (seq, binding key); returns the rows this marked delivered (a
        repeated receipt returns nothing: each row is delivered once).

        One self-fenced statement per chunk of receipts, like :meth:`append_many`: the update, the
        authority check and the rows it changed in one worker-thread hop, so a receipt holds the write
        lock for its commit only (the next owner message's journal write waits behind it)."""
        wanted = sorted(set(receipts))
        newly: list[JournalItem] = []
        for start in range(0, len(wanted), _CHUNK // 2):
            chunk = wanted[start:start + _CHUNK // 2]
            pairs = ", ".join("(?, ?)" for _ in chunk)
            rows = await self._db.self_fenced_statement(
                f"""UPDATE inbound_journal SET status = 'delivered', delivered_at_ms = ?
                    WHERE status = 'pending' AND (seq, binding_key) IN (VALUES {pairs}) AND {{authority_check}}
                    RETURNING *""", [now_ms, *(value for pair in chunk for value in pair)], authority)
            if not rows and not await self._db.still_leader(authority):
                raise AuthorityLost("leader lease changed hands")
            newly += [_item(r) for r in rows]
        return sorted(newly, key=lambda i: i.seq)

    async def settle(self, seq: int, binding_key: str, status: str, now_ms: int, authority: Authority) -> bool:
        """Settle one waiting row without a receipt (``skipped`` or ``expired``)."""
        if status not in SETTLED or status == "delivered":
            raise ValueError(f"not a settling status: {status}")
        async with self._db.unit_of_work(authority) as uow:
            return await uow.execute(
                """UPDATE inbound_journal SET status = ?, delivered_at_ms = ?
                   WHERE seq = ? AND binding_key = ? AND status = 'pending'""",
                (status, now_ms, seq, binding_key)) == 1

    # --- albums -----------------------------------------------------------------------------------
    async def count_gathering(self, binding_key: str, media_group: str) -> int:
        return int(await self._db.fetch_value(
            "SELECT COUNT(*) FROM inbound_journal WHERE status = 'gathering' AND binding_key = ? AND media_group = ?",
            (binding_key, media_group)) or 0)

    async def gathering_groups(self) -> list[tuple[str, str]]:
        """(binding key, media group) of every album still gathering (e.g. left by a crashed leader)."""
        rows = await self._db.fetch_all(
            """SELECT binding_key, media_group, MIN(seq) AS first FROM inbound_journal WHERE status = 'gathering'
               AND media_group IS NOT NULL GROUP BY binding_key, media_group ORDER BY first""")
        return [(r["binding_key"], r["media_group"] or "") for r in rows]

    async def seal_group(self, binding_key: str, media_group: str,
                         combine: Callable[[list[InboundItem]], InboundItem], now_ms: int,
                         authority: Authority, *, parts_per_item: int | None = None) -> list[JournalItem]:
        """Close an album: in one transaction its first gathering row becomes the album (payload
        ``combine(parts)``, pending) and the other parts become ``merged``. With ``parts_per_item``,
        each run of that many parts (in journal order) becomes one item the same way, so a longer
        album loses no part. Returns the items, in order; [] when nothing gathers."""
        sealed: list[JournalItem] = []
        async with self._db.unit_of_work(authority) as uow:
            rows = await uow.fetch_all(
                """SELECT * FROM inbound_journal WHERE status = 'gathering' AND binding_key = ? AND media_group = ?
                   ORDER BY seq""", (binding_key, media_group))
            parts = [_item(r) for r in rows]
            step = parts_per_item or len(parts) or 1
            for start in range(0, len(parts), step):
                run = parts[start:start + step]
                album = combine([p.payload for p in run])
                first = run[0]
                await uow.execute("UPDATE inbound_journal SET status = 'pending', payload = ? WHERE seq = ?",
                                  (_dump(album), first.seq))
                merged = [p.seq for p in run[1:]]
                for chunk in range(0, len(merged), _CHUNK):
                    seqs = merged[chunk:chunk + _CHUNK]
                    await uow.execute(
                        f"""UPDATE inbound_journal SET status = 'merged', delivered_at_ms = ?
                            WHERE seq IN ({', '.join('?' for _ in seqs)})""", [now_ms, *seqs])
                sealed.append(JournalItem(first.seq, first.update_id, binding_key, album, first.attempts,
                                          first.created_at_ms, "pending", media_group))
        return sealed

    # --- voice notes held for their transcript ---------------------------------------------------
    async def held_for_transcript(self) -> list[JournalItem]:
        """Rows held without a media group (voice notes waiting for their transcript, e.g. left by a
        crashed leader), in journal order."""
        rows = await self._db.fetch_all(
            "SELECT * FROM inbound_journal WHERE status = 'gathering' AND media_group IS NULL ORDER BY seq")
        return [_item(r) for r in rows]

    @staticmethod
    async def release_held_tx(uow: UnitOfWork, seq: int, binding_key: str, payload: InboundItem | None) -> bool:
        """A held voice note becomes ``pending`` (deliverable), with ``payload`` (its transcript item)
        instead of what was journaled, or as it was (None). False when it is no longer held (dropped)."""
        if payload is None:
            return await uow.execute(
                """UPDATE inbound_journal SET status = 'pending' WHERE seq = ? AND binding_key = ?
                   AND status = 'gathering' AND media_group IS NULL""", (seq, binding_key)) == 1
        return await uow.execute(
            """UPDATE inbound_journal SET status = 'pending', payload = ? WHERE seq = ? AND binding_key = ?
               AND status = 'gathering' AND media_group IS NULL""", (_dump(payload), seq, binding_key)) == 1

    # --- the offline queue ----------------------------------------------------------------------
    async def drop_waiting(self, binding_key: str, now_ms: int, authority: Authority) -> int:
        """``/drop``: every row still waiting for this binding's follower is dropped."""
        async with self._db.unit_of_work(authority) as uow:
            return await uow.execute(
                """UPDATE inbound_journal SET status = 'dropped', delivered_at_ms = ?
                   WHERE binding_key = ? AND status IN ('pending', 'gathering')""", (now_ms, binding_key))

    async def expire_older_than(self, cutoff_ms: int, now_ms: int, authority: Authority) -> int:
        """Rows journaled before ``cutoff_ms`` and still pending expire (the topic is told later)."""
        async with self._db.unit_of_work(authority) as uow:
            return await uow.execute(
                """UPDATE inbound_journal SET status = 'expired', delivered_at_ms = ?
                   WHERE status = 'pending' AND created_at_ms < ?""", (now_ms, cutoff_ms))

    async def unreported_expired(self) -> dict[str, list[JournalItem]]:
        """Expired rows the topic was not told about yet, by binding, in journal order."""
        rows = await self._db.fetch_all(
            "SELECT * FROM inbound_journal WHERE status = 'expired' AND reported_at_ms IS NULL ORDER BY seq")
        found: dict[str, list[JournalItem]] = {}
        for r in rows:
            found.setdefault(r["binding_key"], []).append(_item(r))
        return found

    async def mark_reported(self, seqs: Sequence[int], now_ms: int, authority: Authority) -> None:
        async with self._db.unit_of_work(authority) as uow:
            for start in range(0, len(seqs), _CHUNK):
                chunk = list(seqs[start:start + _CHUNK])
                await uow.execute(
                    f"UPDATE inbound_journal SET reported_at_ms = ? WHERE seq IN ({', '.join('?' for _ in chunk)})",
                    [now_ms, *chunk])

    # --- files and figures ----------------------------------------------------------------------
    async def has_file(self, file_id: str) -> bool:
        """Whether a routed owner message carried this Telegram file (a message's ``document`` or
        any file of a ``media`` item: both are stored as ``"fileId":"…"`` in the payload)."""
        needle = '%"fileId":' + json.dumps(file_id) + '%'
        return await self._db.fetch_value(
            "SELECT EXISTS (SELECT 1 FROM inbound_journal WHERE payload LIKE ? ESCAPE '\\')",
            (needle.replace("_", "\\_"),)) == 1

    async def count_waiting_entries(self, binding_key: str) -> int:
        """How many things wait for this binding's follower as the owner counts them: every row,
        except that the parts of an album still gathering count once (``/queue``)."""
        return int(await self._db.fetch_value(
            """SELECT COALESCE(SUM(status = 'pending' OR media_group IS NULL), 0)
                      + COUNT(DISTINCT CASE WHEN status = 'gathering' THEN media_group END)
               FROM inbound_journal WHERE binding_key = ? AND status IN ('pending', 'gathering')""",
            (binding_key,)) or 0)

    async def count_pending(self) -> dict[str, int]:
        rows = await self._db.fetch_all(
            """SELECT binding_key, COUNT(*) AS n FROM inbound_journal WHERE status IN ('pending', 'gathering')
               GROUP BY binding_key""")
        return {r["binding_key"]: r["n"] for r in rows}

    async def purge_delivered(self, older_than_ms: int, authority: Authority) -> int:
        """Drop settled rows (delivered, merged, skipped, dropped, expired and reported) older than the cutoff."""
        async with self._db.unit_of_work(authority) as uow:
            return await uow.execute(
                """DELETE FROM inbound_journal WHERE delivered_at_ms < ?
                   AND (status IN ('delivered', 'merged', 'skipped', 'dropped')
                        OR (status = 'expired' AND reported_at_ms IS NOT NULL))""", (older_than_ms,))
