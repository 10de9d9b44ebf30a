"""A database made by release 0.2 (``tests/data/database-0.2.sqlite3``, made by
``tests/data/make_database_0_2.py`` with real 0.2 processes) opens with today's schema without loss:
its topics keep their slots and threads, its stored preferences still rule, its pending cleanup is
still pending, and the messages queued for an offline agent reach that agent when it returns, in
order. The JSON 0.2 stored (journal and outbox payloads, camelCase) reads as today's records, and a
queued item reaches the agent exactly as 0.2 journaled it. Every later schema change must keep this
test green: migrations only go forward, and a 0.2 database loses nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from topicbus.core.records import MessageItem, Notice, TextMessage
from topicbus.storage.cleanups import ScheduledCleanupRepository
from topicbus.storage.journal import JournalRepository
from topicbus.storage.migrate import discover
from tests.integration.leader_env import CHAT, LeaderEnv
from tests.support.waiting import wait_until

DATABASE_0_2 = Path(__file__).parents[1] / "data" / "database-0.2.sqlite3"
SCHEMA_0_2 = 7  # PRAGMA user_version of the committed file
MADE_AT_MS = 1_796_305_251_100  # the 0.2 leader stopped then; a minute later nothing has expired yet


def topics_as_0_2_left_them(env: LeaderEnv) -> None:
    for thread, name in ((2, "topicbus control"), (8, "Shop"), (18, "Api"), (23, "Docs")):
        env.fake.push_topic_event(CHAT, thread, "created", name)


async def test_a_0_2_database_keeps_its_topics_preferences_cleanups_and_queue(env: LeaderEnv):
    shutil.copyfile(DATABASE_0_2, env.tmp / "topicbus.sqlite3")
    topics_as_0_2_left_them(env)
    env.display_mode = None
    env.clock.now = MADE_AT_MS + 60_000
    services = await env.start()
    assert len(discover()) >= SCHEMA_0_2

    by_title = {b.display_title: b for b in await env.bindings()}
    assert {t: (b.slot, b.thread_id) for t, b in by_title.items()} == {
        "topicbus control": ("A", 2), "Shop": ("B", 8), "Api": ("C", 18), "Docs": ("D", 23)}
    assert env.calls("createForumTopic") == []  # the control topic was found, not made again

    snapshot = await services.status.snapshot()
    assert snapshot.term is not None
    assert snapshot.term.cleanup_policy == "on" and snapshot.term.display_mode == "directory-title"
    states = {b.title: (b.state, b.queued) for b in snapshot.bindings}
    assert states == {"topicbus control": ("control", 0), "Shop": ("preserved", 3), "Api": ("ending", 0),
                      "Docs": ("live", 0)}  # restored from its owner row until it proves absent
    assert env.db is not None
    [pending] = await ScheduledCleanupRepository(env.db).all()
    assert pending.binding_key == by_title["Api"].binding_key and pending.thread_id == 18

    shop = by_title["Shop"]
    queued = await JournalRepository(env.db).pending(shop.binding_key)
    assert [i.payload for i in queued] == [
        MessageItem(text=text, message_id=message_id, from_user_id=424242, from_name="Owner", date=1796305248)
        for text, message_id in (("queued one", 12), ("queued two", 13), ("/help queued three", 14))]
    journaled = {r["seq"]: json.loads(r["payload"]) for r in await env.db.fetch_all(
        "SELECT seq, payload FROM inbound_journal WHERE binding_key = ?", (shop.binding_key,))}
    outbox = await services.router.outbox.payloads([1, 4, 10])  # sent rows, read as the items they were
    assert outbox[4] == TextMessage("agent ready", "pre") and outbox[10] == TextMessage("⏹ exited with code 3 after 0.4 s")
    assert isinstance(outbox[1], Notice) and outbox[1].text.startswith("👋 topicbus 0.2.0 is running.")

    ack = await env.register("shop-again", cwd=shop.cwd, name="claude", host=shop.host_id)
    assert (ack["slot"], ack["threadId"]) == ("B", 8)  # the same topic, not a new one

    def delivered() -> list[str]:
        return [d["item"].get("text") for d in env.connections["shop-again"].deliveries()]

    await wait_until(lambda: len(delivered()) >= 3, timeout=10, message=lambda: f"three queued: {delivered()}")
    assert delivered() == ["queued one", "queued two", "/help queued three"]
    # Each reached the agent intact: its item is the JSON 0.2 journaled, field for field.
    deliveries = env.connections["shop-again"].deliveries()
    assert [d["item"] for d in deliveries] == [journaled[i.seq] for i in queued]
    assert [d["deliveryId"] for d in deliveries] == [i.delivery_id for i in queued]
