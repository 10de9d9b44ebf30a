"""The journal's states on a real SQLite file: the migration keeps rows and the seq high-water mark
(a delivery id is never handed out twice), receipts settle each row once, albums seal in one
transaction, /drop and expiry settle what waits, and the purge keeps what the topic was not told."""

from __future__ import annotations

import json
import sqlite3

import pytest

from topicbus.core.records import (ButtonItem, ControlItem, DocumentRef, EditItem, FileRef, InboundItem, MediaItem,
                                   MessageItem, ReplyContext, UnknownItem)
from topicbus.leader.inbound import combine_album
from topicbus.storage.db import Database
from topicbus.storage.lease import LeaseRepository
from topicbus.storage.journal import JournalRepository
from topicbus.storage.migrate import apply_migrations, discover


def test_the_migration_keeps_rows_and_never_reuses_a_seq(tmp_path):
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    migrations = discover()
    before = next(i for i, m in enumerate(migrations) if "inbound_states" in m.name)
    apply_migrations(conn, migrations[:before])
    for update_id in range(1, 6):
        conn.execute("INSERT INTO inbound_journal (update_id, binding_key, payload, created_at_ms) VALUES (?, 'k', '{}', 1)",
                     (update_id,))
    conn.execute("UPDATE inbound_journal SET status = 'delivered', delivered_at_ms = 2 WHERE seq <= 2")
    conn.execute("DELETE FROM inbound_journal WHERE seq >= 4")  # purged: the high-water mark stays 5
    apply_migrations(conn, migrations)
    assert conn.execute("SELECT seq, status FROM inbound_journal").fetchall() == [(1, "delivered"), (2, "delivered"),
                                                                                    (3, "pending")]
    conn.execute("INSERT INTO inbound_journal (update_id, binding_key, payload, created_at_ms) VALUES (9, 'k', '{}', 1)")
    assert conn.execute("SELECT MAX(seq) FROM inbound_journal").fetchone()[0] == 6
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE inbound_journal SET status = 'lost' WHERE seq = 3")
    conn.close()


def photo(file_id: str, caption: str | None = None) -> MediaItem:
    return MediaItem(files=(FileRef(file_id=file_id, file_name="p.jpg", kind="photo"),), caption=caption, message_id=1)


async def test_receipts_seal_drop_expire_and_purge(tmp_path):
    db = await Database.open(tmp_path / "j.sqlite3")
    try:
        authority = await LeaseRepository(db).try_acquire("me", 1_000, 8_000)
        assert authority is not None
        journal = JournalRepository(db)
        items = await journal.append_many([(1, "a", photo("p1", "trip"), "g"), (2, "a", photo("p2"), "g"),
                                           (3, "a", MessageItem(text="after")), (4, "b", MessageItem())],
                                          1_000, authority)
        assert [i.status for i in items] == ["gathering", "gathering", "pending", "pending"]
        assert [i.status for i in await journal.pending("a")] == ["gathering", "gathering", "pending"]
        assert await journal.count_pending() == {"a": 3, "b": 1}
        assert await journal.gathering_groups() == [("a", "g")]

        (album,) = await journal.seal_group("a", "g", combine_album, 2_000, authority)
        assert isinstance(album.payload, MediaItem) and [f.file_id for f in album.payload.files] == ["p1", "p2"]
        assert await journal.seal_group("a", "g", combine_album, 2_000, authority) == []  # sealed once
        assert [(i.seq, i.status) for i in await journal.pending("a")] == [(1, "pending"), (3, "pending")]
        assert await journal.has_file("p2")  # every routed file stays servable

        settled = await journal.settle_receipts([(1, "a"), (1, "a"), (3, "wrong-binding")], 3_000, authority)
        assert [i.seq for i in settled] == [1]
        assert await journal.settle_receipts([(1, "a")], 3_000, authority) == []  # once

        assert await journal.drop_waiting("a", 4_000, authority) == 1
        assert await journal.expire_older_than(2_000, 5_000, authority) == 1  # b's row
        assert [i.seq for i in (await journal.unreported_expired())["b"]] == [4]
        assert await journal.purge_delivered(10_000, authority) == 3  # delivered, merged, dropped
        await journal.mark_reported([4], 6_000, authority)  # the topic was told: b's row may go too
        assert await journal.purge_delivered(10_000, authority) == 1
        assert await db.fetch_value("SELECT COUNT(*) FROM inbound_journal") == 0
    finally:
        await db.close()


async def test_an_album_longer_than_an_item_is_sealed_into_several_and_loses_no_part(tmp_path):
    db = await Database.open(tmp_path / "j.sqlite3")
    try:
        authority = await LeaseRepository(db).try_acquire("me", 1_000, 8_000)
        assert authority is not None
        journal = JournalRepository(db)
        await journal.append_many([(u, "a", photo(f"p{u}"), "g") for u in range(1, 251)], 1_000, authority)
        sealed = await journal.seal_group("a", "g", combine_album, 2_000, authority, parts_per_item=100)
        assert all(isinstance(i.payload, MediaItem) for i in sealed)
        assert [len(i.payload.files) for i in sealed] == [100, 100, 50]  # type: ignore[union-attr]
        assert [f.file_id for i in sealed for f in i.payload.files] == [  # type: ignore[union-attr]
            f"p{u}" for u in range(1, 251)]
        assert [i.seq for i in await journal.pending("a")] == [1, 101, 201]  # each item is its first part's row
        assert await db.fetch_value("SELECT COUNT(*) FROM inbound_journal WHERE status = 'merged'") == 247
    finally:
        await db.close()


async def test_the_waiting_count_covers_every_row_and_an_album_still_gathering_once(tmp_path):
    db = await Database.open(tmp_path / "j.sqlite3")
    try:
        authority = await LeaseRepository(db).try_acquire("me", 1_000, 8_000)
        assert authority is not None
        journal = JournalRepository(db)
        rows = [(u, "a", MessageItem(text=str(u))) for u in range(1, 2501)]
        rows += [(3000 + u, "a", photo(f"g{u}"), "album-1") for u in range(12)]
        rows += [(4000 + u, "a", photo(f"h{u}"), "album-2") for u in range(3)]
        rows += [(5000, "b", MessageItem(text="other"))]
        await journal.append_many(rows[:1000], 1_000, authority)
        await journal.append_many(rows[1000:], 1_000, authority)
        assert await journal.count_waiting_entries("a") == 2502
        assert await journal.count_waiting_entries("b") == 1
        assert await journal.count_waiting_entries("nobody") == 0
        await journal.seal_group("a", "album-1", combine_album, 2_000, authority)
        assert await journal.count_waiting_entries("a") == 2502  # sealed: one row now
        await journal.drop_waiting("a", 3_000, authority)
        assert await journal.count_waiting_entries("a") == 0
    finally:
        await db.close()


VOICE = FileRef(file_id="F", file_name="v.ogg", mime_type="audio/ogg", file_size=9, kind="voice", duration=3)
VOICE_JSON = {"fileId": "F", "fileName": "v.ogg", "mimeType": "audio/ogg", "fileSize": 9, "kind": "voice",
              "duration": 3, "tooLarge": False}
REPLY = ReplyContext(message_id=5, text="q", from_name="Bot", from_agent=True)
REPLY_JSON = {"messageId": 5, "text": "q", "fromName": "Bot", "fromAgent": True, "quote": None}
STORED = [  # each item, and its row's payload as every release wrote it (0.2 and 0.3 too)
    (MessageItem(text="hi", message_id=1, from_user_id=2, from_name="Ada", date=3, reply=REPLY),
     {"type": "message", "text": "hi", "caption": None, "messageId": 1, "fromUserId": 2, "fromName": "Ada", "date": 3,
      "document": None, "reply": REPLY_JSON}),
    (MessageItem(caption="c", document=DocumentRef("D", "r.txt", "text/plain", 4)),
     {"type": "message", "text": None, "caption": "c", "messageId": None, "fromUserId": None, "fromName": None,
      "date": None, "document": {"fileId": "D", "fileName": "r.txt", "mimeType": "text/plain", "fileSize": 4},
      "reply": None}),
    (MessageItem(text="spoken", message_id=1, transcribed_from=VOICE),
     {"type": "message", "text": "spoken", "caption": None, "messageId": 1, "fromUserId": None, "fromName": None,
      "date": None, "document": None, "reply": None, "transcribedFrom": VOICE_JSON}),
    (MediaItem(files=(VOICE,), caption="c", message_id=1, from_user_id=2, from_name="Ada", date=3, reply=REPLY),
     {"type": "media", "files": [VOICE_JSON], "caption": "c", "messageId": 1, "fromUserId": 2, "fromName": "Ada",
      "date": 3, "reply": REPLY_JSON}),
    (EditItem(message_id=1, text="better"), {"type": "edit", "messageId": 1, "text": "better"}),
    (ControlItem("kill", message_id=2), {"type": "control", "action": "kill", "messageId": 2}),
    (ButtonItem("yes", message_id=7, from_user_id=2), {"type": "button", "data": "yes", "messageId": 7,
                                                      "fromUserId": 2}),
]


@pytest.mark.parametrize("item, payload", STORED, ids=[f"{i}-{item.type}" for i, (item, _) in enumerate(STORED)])
async def test_items_are_stored_in_the_shape_every_release_wrote_and_read_back(tmp_path, item: InboundItem,
                                                                             payload: dict):
    db = await Database.open(tmp_path / "j.sqlite3")
    try:
        authority = await LeaseRepository(db).try_acquire("me", 1_000, 8_000)
        assert authority is not None
        journal = JournalRepository(db)
        (written,) = await journal.append_many([(1, "a", item)], 1_000, authority)
        assert json.loads(await db.fetch_value("SELECT payload FROM inbound_journal WHERE seq = ?",
                                               (written.seq,))) == payload
        # A row an earlier release wrote (the same JSON) reads as the same item.
        async with db.unit_of_work(authority) as uow:
            await uow.execute("INSERT INTO inbound_journal (update_id, binding_key, payload, created_at_ms) "
                              "VALUES (2, 'b', ?, 1)", (json.dumps(payload),))
        assert [i.payload for i in await journal.pending("a")] == [item]
        assert [i.payload for i in await journal.pending("b")] == [item]
    finally:
        await db.close()


async def test_rows_of_older_and_newer_releases_read_leniently(tmp_path):
    db = await Database.open(tmp_path / "j.sqlite3")
    try:
        authority = await LeaseRepository(db).try_acquire("me", 1_000, 8_000)
        assert authority is not None
        rows = [{"type": "message", "text": "0.1"},  # fields added later read as absent
                {"type": "message", "text": "later", "fromAgentColour": "blue", "reply": {"messageId": 3}},
                {"type": "poll", "question": "?"}]  # a type a later release journaled: no follower gets it
        async with db.unit_of_work(authority) as uow:
            for update_id, payload in enumerate(rows, start=1):
                await uow.execute("INSERT INTO inbound_journal (update_id, binding_key, payload, created_at_ms) "
                                  "VALUES (?, 'a', ?, 1)", (update_id, json.dumps(payload)))
        assert [i.payload for i in await JournalRepository(db).pending("a")] == [
            MessageItem(text="0.1"), MessageItem(text="later", reply=ReplyContext(message_id=3)), UnknownItem("poll")]
    finally:
        await db.close()
