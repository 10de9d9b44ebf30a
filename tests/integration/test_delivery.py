"""app/leader/delivery.py over a real journal (SQLite file): the hub pushes a binding's journaled
items to the follower that owns it, in journal order and once per route; a new route (a new
registration) carries again everything not acknowledged; receipts are applied in batches and each
settled row is reported once; slow, failing and closed sockets lose nothing and hold back nothing
else; ``send_now`` carries one unjournaled item to one exact generation.

The follower socket is the ``FollowerConnection`` port, faked in memory. The whole leader path
(poller, router, receipt reactions) is covered by ``test_inbound.py`` and ``test_routing.py``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


import pytest

from tests.integration.leader_env import MemoryConnection
from tests.integration.store_env import StoreEnv
from topicbus.leader import delivery
from topicbus.leader.delivery import DeliveryHub
from topicbus.core.records import ControlItem, Deliver, EditItem, FileRef, MediaItem, MessageItem, Superseded
from topicbus.leader.inbound import InboundScreen, combine_album
from topicbus.protocol import CAP_CONTROL
from topicbus.core.authority import AuthorityLost
from topicbus.core.journal import JournalItem
from topicbus.storage.journal import JournalRepository

A, B = "binding-a", "binding-b"


@dataclass
class SlowConnection(MemoryConnection):
    """A follower socket whose every send waits until ``go`` is set (a slow reader)."""

    go: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: asyncio.Event = field(default_factory=asyncio.Event)

    async def send_frame(self, frame: Deliver | Superseded) -> None:
        self.waiting.set()
        await self.go.wait()
        await super().send_frame(frame)


@dataclass
class BrokenConnection(MemoryConnection):
    """A socket whose send number ``fail_at`` (1-based) raises, once; the others go through."""

    fail_at: int = 1
    attempts: int = 0

    async def send_frame(self, frame: Deliver | Superseded) -> None:
        self.attempts += 1
        if self.attempts == self.fail_at:
            raise ConnectionResetError("socket reset")
        await super().send_frame(frame)


class Delivered:
    """``on_delivered``: records each batch of rows a receipt flush newly settled."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.fail = False

    async def __call__(self, items: list[JournalItem]) -> None:
        self.batches.append([i.seq for i in items])
        if self.fail:
            raise RuntimeError("reaction failed")


def hub_of(store: StoreEnv, *, offline_ttl_ms: int | None = None, on_delivered=None) -> DeliveryHub:
    journal = JournalRepository(store.db)
    screen = InboundScreen(journal, store.clock, lambda: store.authority, offline_ttl_ms=offline_ttl_ms)
    return DeliveryHub(journal, store.clock, lambda: store.authority, screen=screen, on_delivered=on_delivered)


async def journal(store: StoreEnv, *rows: tuple) -> list[JournalItem]:
    """Journal rows (binding, text) or (binding, payload[, media group]) as the router does."""
    first = await store.db.fetch_value("SELECT COALESCE(MAX(update_id), 0) FROM inbound_journal")
    entries = []
    for n, row in enumerate(rows, start=first + 1):
        key, body, *group = row
        payload = MessageItem(text=body) if isinstance(body, str) else body
        entries.append((n, key, payload, *group))
    return await JournalRepository(store.db).append_many(entries, store.clock.now_ms(), store.authority)


def ids(conn: MemoryConnection) -> list[str]:
    return [f["deliveryId"] for f in conn.deliveries()]


def texts(conn: MemoryConnection) -> list[str | None]:
    return [f["item"].get("text") for f in conn.deliveries()]


async def statuses(store: StoreEnv) -> dict[int, str]:
    return {r["seq"]: r["status"] for r in await store.db.fetch_all("SELECT seq, status FROM inbound_journal")}


# --- journal order, once per route -----------------------------------------------------------------

async def test_a_kick_sends_only_its_bindings_pending_items_in_journal_order_and_once(store: StoreEnv):
    hub = hub_of(store)
    await journal(store, (A, "a1"), (B, "b1"), (A, "a2"), (A, "a3"))
    conn = MemoryConnection()
    hub.attach(A, "inst-a", "g1", conn)
    assert await hub.kick(A) == 3
    assert ids(conn) == ["d-1", "d-3", "d-4"] and texts(conn) == ["a1", "a2", "a3"]
    assert {(f["instanceId"], f["registrationGeneration"]) for f in conn.frames} == {("inst-a", "g1")}
    assert await hub.kick(A) == 0 and len(conn.frames) == 3  # nothing is carried twice on one route
    assert await hub.kick(B) == 0  # no route: the item waits for its follower
    assert (await statuses(store))[2] == "pending"


async def test_a_new_route_carries_again_everything_not_acknowledged(store: StoreEnv):
    hub = hub_of(store)
    await journal(store, (A, "one"), (A, "two"), (A, "three"))
    first = MemoryConnection()
    hub.attach(A, "inst-a", "g1", first)
    await hub.kick(A)
    assert await hub.receipt(A, "d-1")
    await hub.flush()
    again = MemoryConnection()
    hub.attach(A, "inst-a", "g2", again)  # the follower registered again (a new generation)
    assert await hub.kick(A) == 2
    assert ids(again) == ["d-2", "d-3"]
    assert {f["registrationGeneration"] for f in again.frames} == {"g2"}
    assert len(first.frames) == 3


async def test_a_backlog_longer_than_a_page_is_sent_whole_in_order(store: StoreEnv,
                                                                   monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(delivery, "PAGE", 3)
    hub = hub_of(store)
    await journal(store, *[(A, f"m{n}") for n in range(6)])  # exactly two full pages
    conn = MemoryConnection()
    hub.attach(A, "inst-a", "g1", conn)
    assert await hub.kick(A) == 6
    await journal(store, (B, "other"), (A, "m6"))
    assert await hub.kick(A) == 1
    assert texts(conn) == [f"m{n}" for n in range(7)]
    assert ids(conn) == [f"d-{seq}" for seq in (1, 2, 3, 4, 5, 6, 8)]


# --- what the screen decides per row ----------------------------------------------------------------

def photo(file_id: str) -> MediaItem:
    return MediaItem(files=(FileRef(file_id=file_id, file_name=f"{file_id}.jpg", kind="photo"),), message_id=1)


async def test_an_album_still_gathering_holds_back_everything_after_it(store: StoreEnv):
    hub = hub_of(store)
    await journal(store, (A, "before"), (A, photo("p1"), "album"), (A, photo("p2"), "album"), (A, "after"))
    conn = MemoryConnection()
    hub.attach(A, "inst-a", "g1", conn, frozenset({"media-v1"}))
    assert await hub.kick(A) == 1 and texts(conn) == ["before"]
    assert await hub.deliver_new(A, await journal(store, (A, "later"))) == 0  # still behind the album
    assert texts(conn) == ["before"]
    await JournalRepository(store.db).seal_group(A, "album", combine_album, store.clock.now_ms(), store.authority)
    assert await hub.kick(A) == 3
    assert ids(conn) == ["d-1", "d-2", "d-4", "d-5"]  # the album is its first part's row; the second is merged
    album = conn.deliveries()[1]["item"]
    assert album["type"] == "media" and [f["fileId"] for f in album["files"]] == ["p1", "p2"]


async def test_rows_a_follower_is_not_given_are_settled_and_never_block_the_rest(store: StoreEnv):
    hub = hub_of(store, offline_ttl_ms=60_000)
    (old,) = await journal(store, (A, "typed an hour ago"))
    store.clock.advance(3_600_000)
    await journal(store, (A, EditItem(7, "an edit")), (A, "fresh"))
    conn = MemoryConnection()
    hub.attach(A, "inst-a", "g1", conn)  # no edit-v1
    assert not hub._screen.expired.is_set()  # noqa: SLF001 - the screen the hub was given
    assert await hub.kick(A) == 1
    assert texts(conn) == ["fresh"]
    assert await statuses(store) == {old.seq: "expired", 2: "skipped", 3: "pending"}
    assert hub._screen.expired.is_set()  # noqa: SLF001 - the topic is told through this event
    successor = MemoryConnection()
    hub.attach(A, "inst-a", "g2", successor, frozenset({"edit-v1"}))
    await hub.kick(A)
    assert texts(successor) == ["fresh"]  # settled rows are never offered again, whoever asks


# --- slow, failing and closed sockets ---------------------------------------------------------------

async def test_a_closed_socket_gets_nothing_and_its_items_wait_for_the_next_route(store: StoreEnv):
    hub = hub_of(store)
    await journal(store, (A, "one"), (A, "two"))
    gone = MemoryConnection(closed=True)
    hub.attach(A, "inst-a", "g1", gone)
    assert not hub.is_online(A)
    assert await hub.kick(A) == 0 and gone.frames == []
    assert await hub.deliver_new(A, await journal(store, (A, "three"))) == 0
    assert set((await statuses(store)).values()) == {"pending"}
    hub.detach_connection(gone)
    assert await hub.kick(A) == 0  # no route at all
    back = MemoryConnection()
    hub.attach(A, "inst-a", "g2", back)
    assert hub.is_online(A) and await hub.kick(A) == 3
    assert texts(back) == ["one", "two", "three"]


async def test_a_send_that_fails_stops_the_kick_and_the_next_kick_resumes_at_that_item(store: StoreEnv):
    hub = hub_of(store)
    await journal(store, (A, "one"), (A, "two"), (A, "three"), (A, "four"))
    conn = BrokenConnection(fail_at=3)
    hub.attach(A, "inst-a", "g1", conn)
    assert await hub.kick(A) == 2
    assert texts(conn) == ["one", "two"]
    assert await hub.kick(A) == 2
    assert texts(conn) == ["one", "two", "three", "four"]  # nothing lost, nothing twice


async def test_new_items_go_straight_out_on_a_caught_up_route_and_behind_the_backlog_otherwise(
        store: StoreEnv):
    hub = hub_of(store)
    conn = MemoryConnection()
    hub.attach(A, "inst-a", "g1", conn)
    assert await hub.kick(A) == 0  # caught up: nothing pending
    assert await hub.deliver_new(A, await journal(store, (A, "one"), (A, "two"))) == 2
    assert texts(conn) == ["one", "two"]
    late = MemoryConnection()
    hub.attach(A, "inst-a", "g2", late)  # a new route has carried nothing yet
    assert await hub.deliver_new(A, await journal(store, (A, "three"))) == 0  # left to the route's pump
    await hub.kick(A)  # joins that pump
    assert texts(late) == ["one", "two", "three"]  # the unacknowledged backlog first, in order
    items = await JournalRepository(store.db).pending(A)
    assert await hub.deliver_new(A, items[:1]) == 0  # already carried on this route: not again
    assert texts(late) == ["one", "two", "three"]


async def test_a_failed_direct_send_falls_back_to_the_journal_and_loses_nothing(store: StoreEnv):
    hub = hub_of(store)
    conn = BrokenConnection(fail_at=2)
    hub.attach(A, "inst-a", "g1", conn)
    await hub.kick(A)
    assert await hub.deliver_new(A, await journal(store, (A, "one"), (A, "two"))) == 1
    assert texts(conn) == ["one"]
    await hub.deliver_new(A, await journal(store, (A, "three")))  # not caught up: the pump sends
    await hub.kick(A)
    assert texts(conn) == ["one", "two", "three"]


async def test_concurrent_kicks_to_a_slow_follower_send_each_item_once_in_order(store: StoreEnv):
    hub = hub_of(store)
    await journal(store, (A, "one"), (A, "two"))
    conn = SlowConnection()
    hub.attach(A, "inst-a", "g1", conn)
    first = asyncio.create_task(hub.kick(A))
    await conn.waiting.wait()  # blocked sending "one"
    later = await journal(store, (A, "three"))
    others = [asyncio.create_task(hub.kick(A)), asyncio.create_task(hub.deliver_new(A, later))]
    conn.go.set()
    await asyncio.gather(first, *others)
    assert texts(conn) == ["one", "two", "three"]


async def test_a_slow_follower_holds_back_no_other_binding(store: StoreEnv):
    hub = hub_of(store)
    await journal(store, (A, "for a"), (B, "for b"))
    slow, quick = SlowConnection(), MemoryConnection()
    hub.attach(A, "inst-a", "g1", slow)
    hub.attach(B, "inst-b", "g1", quick)
    stuck = asyncio.create_task(hub.kick(A))
    await slow.waiting.wait()
    assert await hub.kick(B) == 1 and texts(quick) == ["for b"]
    assert not stuck.done() and slow.frames == []
    slow.go.set()
    assert await stuck == 1 and texts(slow) == ["for a"]


async def test_a_route_replaced_during_a_slow_send_gets_nothing_more(store: StoreEnv):
    hub = hub_of(store)
    await journal(store, (A, "one"), (A, "two"), (A, "three"))
    old = SlowConnection()
    hub.attach(A, "inst-a", "g1", old)
    stuck = asyncio.create_task(hub.kick(A))
    await old.waiting.wait()  # "one" is in flight to the old process
    new = MemoryConnection()
    hub.attach(A, "inst-a2", "g2", new)  # a newer registration of the workspace supersedes it
    old.go.set()
    await stuck
    # The old route's pump is stopped: at most the send in flight reaches the old process.
    assert texts(old) in ([], ["one"])
    assert await hub.kick(A) == 3 and texts(new) == ["one", "two", "three"]

    # The same on the direct path (a caught-up route handed items just journaled).
    old_b = SlowConnection()
    old_b.go.set()
    hub.attach(B, "inst-b", "g1", old_b)
    await hub.kick(B)
    old_b.go.clear()
    stuck = asyncio.create_task(hub.deliver_new(B, await journal(store, (B, "four"), (B, "five"))))
    await old_b.waiting.wait()
    new_b = MemoryConnection()
    hub.attach(B, "inst-b2", "g2", new_b)
    old_b.go.set()
    await stuck
    assert texts(old_b) == ["four"]
    assert await hub.kick(B) == 2 and texts(new_b) == ["four", "five"]


# --- receipts ---------------------------------------------------------------------------------------

async def test_receipts_are_applied_in_batches_and_each_settled_row_is_reported_once(store: StoreEnv):
    delivered = Delivered()
    hub = hub_of(store, on_delivered=delivered)
    await journal(store, (A, "one"), (A, "two"), (B, "other"), (A, "three"))
    for delivery_id in ("d-1", "d-2", "d-4", "d-2"):  # queued before the flusher runs: one batch
        assert await hub.receipt(A, delivery_id)
    assert await hub.receipt(A, "d-3")  # queued, but row 3 is another binding's: not settled
    for bad in ("x-1", "d-", "d-one", "d-" + "9" * 19):
        assert not await hub.receipt(A, bad)
    await hub.flush()
    assert delivered.batches == [[1, 2, 4]] and hub.delivered == 3
    assert await statuses(store) == {1: "delivered", 2: "delivered", 3: "pending", 4: "delivered"}
    assert await hub.receipt(A, "d-1")  # a repeated receipt (a follower's redelivery) is no news
    await hub.flush()
    assert delivered.batches == [[1, 2, 4]] and hub.delivered == 3


async def test_receipts_arriving_during_a_flush_form_the_next_batch_and_a_failed_reaction_costs_none(
        store: StoreEnv):
    gate, entered = asyncio.Event(), asyncio.Event()
    seen: list[list[int]] = []

    async def on_delivered(items: list[JournalItem]) -> None:
        seen.append([i.seq for i in items])
        entered.set()
        await gate.wait()
        raise RuntimeError("reaction failed")

    hub = hub_of(store, on_delivered=on_delivered)
    await journal(store, (A, "one"), (A, "two"), (A, "three"))
    await hub.receipt(A, "d-1")
    await entered.wait()  # the first batch is recorded; its reaction is running
    await hub.receipt(A, "d-2")
    await hub.receipt(A, "d-3")
    gate.set()
    await hub.flush()
    assert seen == [[1], [2, 3]]
    assert hub.delivered == 3 and set((await statuses(store)).values()) == {"delivered"}


async def test_a_term_that_lost_its_lease_records_no_receipt_and_settles_no_row(store: StoreEnv):
    delivered = Delivered()
    await journal(store, (A, "one"))
    store.clock.advance(120_000)
    stale = await store.take_over()
    old_term = DeliveryHub(JournalRepository(store.db), store.clock, lambda: stale, on_delivered=delivered,
                           screen=InboundScreen(JournalRepository(store.db), store.clock, lambda: stale,
                                                offline_ttl_ms=60_000))
    assert await old_term.receipt(A, "d-1")
    await old_term.flush()
    assert delivered.batches == [] and old_term.delivered == 0
    conn = MemoryConnection()
    old_term.attach(A, "inst-a", "g1", conn)
    with pytest.raises(AuthorityLost):  # the row is past the TTL, but expiring it is a write
        await old_term.kick(A)
    assert conn.frames == [] and await statuses(store) == {1: "pending"}  # still owed, as it was


# --- control items ------------------------------------------------------------------------------------

async def test_send_now_reaches_only_the_live_generation_that_takes_it_and_is_never_journaled(
        store: StoreEnv):
    hub = hub_of(store)
    kill = ControlItem("kill")
    conn = MemoryConnection()
    assert not await hub.send_now(A, "inst-a", "g1", "c-1", kill)  # no route yet
    hub.attach(A, "inst-a", "g1", conn, frozenset({CAP_CONTROL}))
    assert not await hub.send_now(A, "inst-a", "g0", "c-1", kill)  # an earlier generation
    assert not await hub.send_now(A, "inst-b", "g1", "c-1", kill)  # another process
    assert not await hub.send_now(A, "inst-a", "g1", "c-1", ControlItem("screen"))  # screen-v1 not advertised
    assert await hub.send_now(A, "inst-a", "g1", "c-1", kill)
    assert conn.deliveries() == [{"kind": "leader.deliver", "requestId": "c-1", "deliveryId": "c-1",
                                  "instanceId": "inst-a", "registrationGeneration": "g1",
                                  "item": {"type": "control", "action": "kill", "messageId": None}}]
    broken = BrokenConnection(fail_at=1)
    hub.attach(A, "inst-a", "g2", broken, frozenset({CAP_CONTROL}))
    assert not await hub.send_now(A, "inst-a", "g2", "c-2", kill)  # the socket failed: the caller says so
    assert not await hub.send_now(A, "inst-a", "g1", "c-3", kill)  # g1 is no longer the live route
    assert await store.db.fetch_value("SELECT COUNT(*) FROM inbound_journal") == 0
