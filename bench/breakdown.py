"""Inbound cost breakdown — where one routed owner message spends its time, measured in-process.

The inbound benchmark measures the leader end to end as a subprocess; this one re-runs each step of
the same path in the bench process, on the real code, one step at a time (wall time per call,
median of many), so the end-to-end figure can be explained:

1. PTB parses the ``getUpdates`` JSON into an ``Update`` (``Update.de_json``; the fake sends what
   Telegram sends for a topic message, including the nested ``reply_to_message``);
2. PTB dispatches it through the leader's handlers (``Application.process_update`` with the real
   ``topicbus.handlers.register_all`` and a runtime stub whose ``route_owner_message`` does nothing);
3. the runtime's storage calls for one message, on a real ``topicbus.storage.db.Database`` (aiosqlite, WAL,
   ``synchronous=FULL``): ``BindingRepository.by_target``, ``JournalRepository.append``,
   ``JournalRepository.pending`` (the delivery kick), ``JournalRepository.mark_delivered`` (the
   receipt) — and how many aiosqlite thread round trips each one takes;
4. the routing check ``Roster.is_routed`` makes per update (a scan of
   ``FollowerRegistry.list()``, which copies every record; 25 followers);
5. the bus frames: encoding ``leader.deliver``, decoding the follower's ``bus.ack`` receipt.

For comparison it also times one bare aiosqlite round trip (``SELECT 1``) and the journal append
done with the stdlib ``sqlite3`` module on the calling thread (same statements, same pragmas).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import CHAT_ID, OWNER_ID, TOKEN, BenchFakeBotApi, Context, fmt, say


async def _time_async(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    """Median wall time (ms) of ``await fn()``."""
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000.0


def _time_sync(fn: Callable[[], Any], n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000.0


class _HopCounter:
    """Counts aiosqlite worker-thread round trips (``Connection._execute`` calls)."""

    def __init__(self) -> None:
        import aiosqlite.core as core

        self._core = core
        self._orig = core.Connection._execute
        self.count = 0
        counter = self

        async def counted(conn: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
            counter.count += 1
            return await counter._orig(conn, fn, *args, **kwargs)

        core.Connection._execute = counted  # type: ignore[method-assign]

    def restore(self) -> None:
        self._core.Connection._execute = self._orig  # type: ignore[method-assign]


def _sample_update() -> dict[str, Any]:
    from tests.fakebotapi import FakeBotApi

    fake = FakeBotApi(CHAT_ID)
    topic = fake._m_createForumTopic({"chat_id": CHAT_ID, "name": "bench"})
    return fake.push_message(CHAT_ID, "hello from the owner", thread_id=topic["message_thread_id"], from_id=OWNER_ID)


async def _ptb_steps(n: int) -> dict[str, float]:
    from telegram.ext import ApplicationBuilder

    raw = _sample_update()
    body = json.dumps({"ok": True, "result": [raw]})
    async with BenchFakeBotApi() as fake:  # only for Application.initialize() (getMe)
        app = ApplicationBuilder().token(TOKEN).base_url(fake.base_url).updater(None).build()
        await app.initialize()
        try:
            return await _ptb_measure(app, raw, body, n)
        finally:
            await app.shutdown()


async def _ptb_measure(app: Any, raw: dict[str, Any], body: str, n: int) -> dict[str, float]:
    from telegram import Update

    from topicbus.handlers import topic_messages
    from topicbus.leader.routing import InboundBatches
    from topicbus.leader.topics import ControlTopic

    class _Stub:
        routed = 0

        async def route_owner_message(self, *args: Any, **kwargs: Any) -> None:  # as Router's, which it stands for
            self.routed += 1

    stub = _Stub()
    topic_messages.register(app, router=stub, batches=InboundBatches(stub),  # type: ignore[arg-type]
                            control=ControlTopic(thread_id=999_999), chat_id=CHAT_ID, owner_ids=frozenset({OWNER_ID}))
    bot = app.bot
    out: dict[str, float] = {}
    out["json.loads of the getUpdates body (1 update)"] = _time_sync(lambda: json.loads(body), n)
    out["Update.de_json (PTB object tree)"] = _time_sync(lambda: Update.de_json(raw, bot), n)
    update = Update.de_json(raw, bot)
    await app.process_update(update)
    if stub.routed != 1:
        out["PTB dispatch did not reach the routing handler"] = float("nan")
    out["Application.process_update (handlers, no-op runtime)"] = await _time_async(
        lambda: app.process_update(update), n)
    return out


async def _get_updates_round_trip(n: int) -> float:
    """``bot.get_updates`` returning one update, PTB client + the in-process fake server (both sides)."""
    from telegram.ext import ApplicationBuilder

    async with BenchFakeBotApi() as fake:
        app = ApplicationBuilder().token(TOKEN).base_url(fake.base_url).updater(None).build()
        await app.initialize()
        try:
            topic = fake._m_createForumTopic({"chat_id": CHAT_ID, "name": "bench"})
            offset = [None]

            async def one() -> None:
                fake.push_message(CHAT_ID, "hello from the owner", thread_id=topic["message_thread_id"],
                                  from_id=OWNER_ID)
                updates = await app.bot.get_updates(offset=offset[0], timeout=0)
                offset[0] = updates[-1].update_id + 1

            return await _time_async(one, n)
        finally:
            await app.shutdown()


async def _storage_steps(workdir: Path, n: int) -> tuple[dict[str, float], dict[str, float]]:
    from topicbus.core.bindings import Binding
    from topicbus.core.records import MessageItem
    from topicbus.core.target import Target
    from topicbus.storage.bindings import BindingRepository
    from topicbus.storage.db import Database
    from topicbus.storage.journal import JournalRepository, item_json
    from topicbus.storage.lease import LeaseRepository

    db = await Database.open(workdir / "breakdown.sqlite3")
    try:
        authority = await LeaseRepository(db).try_acquire("bench:breakdown", int(time.time() * 1000), 8000)
        now = int(time.time() * 1000)
        key = "ws-bench-breakdown"
        async with db.unit_of_work(authority) as uow:
            await BindingRepository.insert_tx(uow, Binding(
                binding_key=key, kind="follower", host_id="bench", cwd="/bench", session="", slot="B",
                chat_id=CHAT_ID, thread_id=3, topic_state="open", thread_name="bench", manual_name=None,
                display_title="B", inactive_since_ms=None, offline_notified=False, created_at_ms=now,
                updated_at_ms=now))
        bindings, journal = BindingRepository(db), JournalRepository(db)
        payload = MessageItem(text="hello from the owner", message_id=10, from_user_id=OWNER_ID, from_name="Owner",
                              date=now // 1000)
        update_id = [10_000_000]
        seqs: list[int] = []

        async def append() -> None:
            update_id[0] += 1
            item = await journal.append(update_id[0], key, payload, now, authority)
            assert item is not None
            seqs.append(item.seq)

        async def deliver() -> None:
            await journal.mark_delivered(seqs.pop(0), key, now, authority)

        async def only_one_pending() -> None:
            while len(seqs) > 1:
                await journal.mark_delivered(seqs.pop(0), key, now, authority)
            if not seqs:
                await append()

        async def enough_pending() -> None:
            while len(seqs) < n + 2:
                await append()

        async def nothing() -> None:
            return None

        timings: dict[str, float] = {}
        hops: dict[str, float] = {}
        steps: list[tuple[str, Callable[[], Awaitable[Any]], Callable[[], Awaitable[None]]]] = [
            ("aiosqlite round trip (SELECT 1)", lambda: db.fetch_value("SELECT 1"), nothing),
            ("BindingRepository.by_target", lambda: bindings.by_target(Target(CHAT_ID, 3)), nothing),
            ("JournalRepository.append (journal write txn)", append, nothing),
            ("JournalRepository.pending (delivery kick, 1 pending)", lambda: journal.pending(key), only_one_pending),
            ("JournalRepository.mark_delivered (receipt txn)", deliver, enough_pending),
        ]
        for name, fn, prepare in steps:
            await prepare()
            counter = _HopCounter()
            try:
                await fn()
                hops[name] = counter.count
            finally:
                counter.restore()
            timings[name] = await _time_async(fn, n)
        # What-if: the very same append transaction as ONE call on aiosqlite's worker thread (one hop),
        # on the same connection. Not how storage/ does it today; shows what batching the hops buys.
        conn = db._conn  # aiosqlite.Connection (private use, bench only)

        def append_on_worker(uid: int) -> int:
            raw = conn._conn  # the sqlite3 connection, used on aiosqlite's own thread
            raw.execute("BEGIN IMMEDIATE")
            try:
                row = raw.execute("SELECT owner, epoch FROM leader_lease WHERE id = 1").fetchone()
                assert row is not None and row[0] == authority.owner and row[1] == authority.epoch
                seq = raw.execute(
                    "INSERT INTO inbound_journal (update_id, binding_key, payload, created_at_ms) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (update_id) DO NOTHING RETURNING seq",
                    (uid, key, json.dumps(item_json(payload), separators=(",", ":")), now)).fetchone()[0]
                raw.execute("COMMIT")
                return seq
            except BaseException:
                raw.execute("ROLLBACK")
                raise

        async def append_one_hop() -> None:
            update_id[0] += 1
            await conn._execute(append_on_worker, update_id[0])

        timings["what-if: same append txn as one aiosqlite call (1 hop)"] = await _time_async(append_one_hop, n)
        # pending() with a backlog, as during a burst (the kick re-reads every pending row each time)
        while len(seqs) < 200:
            await append()
        timings["JournalRepository.pending (200 pending, burst backlog)"] = await _time_async(
            lambda: journal.pending(key), max(20, n // 10))
        return timings, hops
    finally:
        await db.close()


def _sync_sqlite_append(workdir: Path, n: int) -> float:
    """The journal append's statements with stdlib sqlite3 on this thread (no worker-thread hop)."""
    path = workdir / "breakdown-sync.sqlite3"
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS leader_lease (id INTEGER PRIMARY KEY, owner TEXT, epoch INTEGER)")
        conn.execute("INSERT OR REPLACE INTO leader_lease VALUES (1, 'bench', 1)")
        conn.execute("""CREATE TABLE IF NOT EXISTS inbound_journal (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                        update_id INTEGER UNIQUE, binding_key TEXT, payload TEXT, created_at_ms INTEGER)""")
        payload = json.dumps({"type": "message", "text": "hello from the owner"})
        counter = [0]

        def append() -> None:
            counter[0] += 1
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("SELECT owner, epoch FROM leader_lease WHERE id = 1").fetchone()
            conn.execute("INSERT INTO inbound_journal (update_id, binding_key, payload, created_at_ms) "
                         "VALUES (?, ?, ?, ?) ON CONFLICT (update_id) DO NOTHING", (counter[0], "k", payload, 0))
            conn.execute("SELECT seq FROM inbound_journal WHERE update_id = ?", (counter[0],)).fetchone()
            conn.execute("COMMIT")

        return _time_sync(append, n)
    finally:
        conn.close()


def _registry_steps(n: int) -> dict[str, float]:
    """``Roster.is_routed`` once scanned ``FollowerRegistry.list()`` (a copy of every record) per update."""
    from topicbus.core.registry import FollowerRecord, FollowerRegistry
    from topicbus.core.target import Target

    registry = FollowerRegistry()
    for i in range(25):
        registry.register(FollowerRecord(instance_id=f"i{i}", registration_generation="g", pid=1000 + i,
                                         profile_key=f"ws-{i}", binding_key=f"ws-{i}", target=Target(CHAT_ID, 10 + i),
                                         slot=chr(66 + i), connected_at_ms=1, last_heartbeat_ms=1))
    return {"FollowerRegistry.list() scan, 25 followers (routing check, per update)":
            _time_sync(lambda: any(f.binding_key == "ws-24" for f in registry.list()), n)}


def _frame_steps(n: int) -> dict[str, float]:
    from topicbus.protocol import decode_frame, encode

    frame = {"kind": "leader.deliver", "requestId": "d-123", "deliveryId": "d-123", "instanceId": "bench-1",
             "registrationGeneration": "0" * 32,
             "item": {"type": "message", "text": "hello from the owner", "caption": None, "messageId": 10,
                      "fromUserId": OWNER_ID, "fromName": "Owner", "date": 1_700_000_000, "document": None}}
    receipt = json.dumps({"kind": "bus.ack", "requestId": "d-123", "ok": True})
    return {
        "encode leader.deliver frame": _time_sync(lambda: encode(frame), n),
        "decode_frame(bus.ack receipt) (pydantic)": _time_sync(lambda: decode_frame(receipt), n),
    }


async def run(ctx: Context) -> None:
    n = 300 if ctx.quick else 1000
    rows: dict[str, float] = {}
    rows.update(await _ptb_steps(n))
    rows["getUpdates round trip, 1 update (PTB/httpx client + fake server, both in-process)"] = \
        await _get_updates_round_trip(max(100, n // 3))
    storage, hops = await _storage_steps(ctx.workdir, n)
    rows.update(storage)
    rows["same journal append, stdlib sqlite3 on the loop thread"] = _sync_sqlite_append(ctx.workdir, n)
    rows.update(_registry_steps(n))
    rows.update(_frame_steps(n))
    per_message = [
        "Update.de_json (PTB object tree)",
        "Application.process_update (handlers, no-op runtime)",
        "BindingRepository.by_target",
        "JournalRepository.append (journal write txn)",
        "JournalRepository.pending (delivery kick, 1 pending)",
        "FollowerRegistry.list() scan, 25 followers (routing check, per update)",
        "encode leader.deliver frame",
        "decode_frame(bus.ack receipt) (pydantic)",
        "JournalRepository.mark_delivered (receipt txn)",
    ]
    total = sum(rows.get(k, 0.0) for k in per_message)
    total_hops = sum(hops.get(k, 0) for k in per_message)
    width = max(len(k) for k in rows)
    say(f"  {'step'.ljust(width)}  median ms  aiosqlite hops")
    for name, ms in rows.items():
        hop = hops.get(name)
        say(f"  {name.ljust(width)}  {fmt(ms, 3):>9}  {'' if hop is None else int(hop):>14}")
    say(f"  {'sum of the per-message steps'.ljust(width)}  {fmt(total, 3):>9}  {int(total_hops):>14}")
    ctx.report.details["breakdown"] = {"steps_ms": rows, "aiosqlite_hops": hops, "per_message_sum_ms": total,
                                       "per_message_hops": total_hops}
    ctx.report.add("inbound breakdown: sum of the leader's per-message steps (in-process)", total, "ms", None,
                   "lower", "parse + dispatch + storage + frames, measured one step at a time (bench/breakdown.py)")
