"""storage/outbox.py on a real SQLite file: an item is stored once per (instance, request); the
scheduler's reads (topics, heads, payloads) see pending rows per topic in arrival order; the rows
of one message are marked sent together; failures and attempts are counted; rows no binding can
carry fail, a binding's rows follow it to a new topic; backlogs count pending rows only; the purge
keeps what is not sent; and a write under a stale authority is refused and changes nothing.

The outbound scheduler on top of it is covered end to end by ``test_cleanup_grace.py``,
``test_outside_hints.py`` and the e2e fault tests; these tests pin the repository's own rules."""

from __future__ import annotations

import json

import pytest

from tests.integration.store_env import StoreEnv
from topicbus.core.target import Target
from topicbus.core.budget import Priority
from topicbus.core.output import QueuedItem
from topicbus.core.records import (Button, ChatActionMessage, DocumentMessage, Notice, OutboxItem, PhotoMessage,
                                   TextMessage)
from topicbus.core.authority import AuthorityLost
from topicbus.core.output import TopicBacklog
from topicbus.storage.outbox import OutboxRepository

CHAT = -1001234567890
OTHER_CHAT = -1009999999999
A, B = "binding-a", "binding-b"


class Outbox:
    """The repository with a counter of request ids, so each test states only what matters."""

    def __init__(self, store: StoreEnv):
        self.store = store
        self.repo = OutboxRepository(store.db)
        self._n = 0

    async def add(self, *, key: str = A, chat: int = CHAT, thread: int | None = 5, instance: str = "inst-a",
                  request: str | None = None, kind: str = "text", item: OutboxItem | None = None, **extra) -> int:
        self._n += 1
        default = Notice(f"item {self._n}") if kind == "notice" else TextMessage(f"item {self._n}")
        item_id, added = await self.repo.enqueue(
            binding_key=key, chat_id=chat, thread_id=thread, instance_id=instance, request_id=request or f"r{self._n}",
            item=item if item is not None else default, now_ms=self.store.clock.now_ms(),
            authority=self.store.authority, **extra)
        assert added
        return item_id

    async def status(self) -> dict[int, str]:
        return {r["id"]: r["status"] for r in await self.store.db.fetch_all("SELECT id, status FROM outbox")}

    async def row(self, item_id: int) -> dict:
        found = await self.store.db.fetch_one("SELECT * FROM outbox WHERE id = ?", (item_id,))
        assert found is not None
        return dict(found)


@pytest.fixture
def outbox(store: StoreEnv) -> Outbox:
    return Outbox(store)


async def bind(store: StoreEnv, key: str, thread: int) -> None:
    """A workspace binding row (what fail_unbound asks about)."""
    async with store.db.unit_of_work(store.authority) as uow:
        await uow.execute("""INSERT INTO workspace_bindings (binding_key, kind, chat_id, thread_id, thread_name,
                                 created_at_ms, updated_at_ms) VALUES (?, 'follower', ?, ?, ?, 0, 0)""",
                          (key, CHAT, thread, key))


# --- storing ---------------------------------------------------------------------------------------

STORED = [  # each item, as its row holds it: the kind and payload every release wrote (0.2 and 0.3 too)
    (TextMessage("hi"), "text", {"text": "hi"}),
    (TextMessage("top", "pre", ((Button("Yes", "y"),),), tail=True, screen=True), "text",
     {"text": "top", "format": "pre", "buttons": [[{"text": "Yes", "data": "y"}]], "tail": True, "screen": True}),
    (ChatActionMessage("typing"), "chatAction", {"action": "typing"}),
    (DocumentMessage("r.txt", b"\x00\xff", "c"), "document", {"fileName": "r.txt", "dataBase64": "AP8=", "caption": "c"}),
    (PhotoMessage("p.png", b"png"), "photo", {"fileName": "p.png", "dataBase64": "cG5n"}),
    (Notice("⏹ done", reply_to=4), "notice", {"text": "⏹ done", "replyTo": 4}),
]


@pytest.mark.parametrize("item, kind, payload", STORED, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(STORED)])
async def test_items_are_stored_in_the_shape_every_release_wrote_and_read_back(outbox: Outbox, item: OutboxItem,
                                                                             kind: str, payload: dict):
    written = await outbox.add(item=item)
    assert await outbox.repo.payloads([written]) == {written: item}
    row = await outbox.row(written)
    assert (row["kind"], json.loads(row["payload"])) == (kind, payload)
    # A row an earlier release wrote reads as the same item (its kind as the item's type).
    async with outbox.store.db.unit_of_work(outbox.store.authority) as uow:
        older = await uow.insert(
            """INSERT INTO outbox (binding_key, chat_id, thread_id, instance_id, request_id, kind, priority, units,
                   bytes, payload, created_at_ms) VALUES (?, ?, 5, 'inst-0.3', 'r', ?, 0, 0, 0, ?, 0)""",
            (A, CHAT, kind, json.dumps(payload)))
    assert await outbox.repo.payloads([older]) == {older: item}
    assert [h.kind for h in await outbox.repo.heads(Target(CHAT, 5)) if h.id == older] == [item.type]


async def test_an_item_is_stored_once_per_instance_and_request(outbox: Outbox):
    repo, now, authority = outbox.repo, outbox.store.clock.now_ms(), outbox.store.authority
    common = dict(binding_key=A, chat_id=CHAT, thread_id=5, now_ms=now, authority=authority)
    first = await repo.enqueue(instance_id="inst-a", request_id="r1", item=TextMessage("hello"), **common)
    # The follower retried the same send (its acknowledgement was lost), even with another body.
    retry = await repo.enqueue(instance_id="inst-a", request_id="r1", item=TextMessage("hello again"), **common)
    assert first[1] and retry == (first[0], False)
    assert await repo.payloads([first[0]]) == {first[0]: TextMessage("hello")}  # the first body stays
    other_instance = await repo.enqueue(instance_id="inst-b", request_id="r1", item=TextMessage("b"), **common)
    other_request = await repo.enqueue(instance_id="inst-a", request_id="r2", item=TextMessage("c"), **common)
    assert other_instance[1] and other_request[1]
    assert len({first[0], other_instance[0], other_request[0]}) == 3
    assert await repo.count_pending() == 3


async def test_heads_carry_what_the_scheduler_plans_with_and_payloads_what_it_sends(outbox: Outbox):
    outbox.store.clock.advance(500)
    plain = await outbox.add(item=TextMessage("plain"))
    notice = await outbox.add(item=Notice("⏹ process ended", reply_to=12), priority=Priority.CONTROL, units=16,
                              fmt="markdown", has_buttons=True)
    heads = await outbox.repo.heads(Target(CHAT, 5))
    assert heads == [QueuedItem(plain, "text", 0, None, Priority.OUTPUT, arrived_ms=1_500, has_buttons=False),
                     QueuedItem(notice, "notice", 16, "markdown", Priority.CONTROL, arrived_ms=1_500,
                                has_buttons=True)]
    assert isinstance(heads[1].priority, Priority)
    assert await outbox.repo.payloads([notice, 9_999]) == {notice: Notice("⏹ process ended", reply_to=12)}
    assert await outbox.repo.payloads([]) == {}
    # The byte count is the stored body's: what the backlog bound is measured in.
    bodies = [json.dumps(p, separators=(",", ":")) for p in ({"text": "plain"},
                                                             {"text": "⏹ process ended", "replyTo": 12})]
    assert await outbox.repo.backlog_of(A) == (2, sum(len(b) for b in bodies))


# --- what the scheduler reads -------------------------------------------------------------------------

async def test_heads_are_one_topics_oldest_pending_rows_in_arrival_order(outbox: Outbox):
    first = await outbox.add(thread=5)
    general = await outbox.add(thread=None, key=B)
    second = await outbox.add(thread=5, kind="notice", priority=Priority.CONTROL)  # urgent, but later
    await outbox.add(thread=6)
    await outbox.add(chat=OTHER_CHAT, thread=5)
    third = await outbox.add(thread=5)
    assert [h.id for h in await outbox.repo.heads(Target(CHAT, 5))] == [first, second, third]
    assert [h.id for h in await outbox.repo.heads(Target(CHAT, 5), limit=2)] == [first, second]
    assert [h.id for h in await outbox.repo.heads(Target(CHAT, None))] == [general]  # General is its own topic
    await outbox.repo.mark_sent([first], 2_000, 77, outbox.store.authority)
    await outbox.repo.mark_failed(second, "Bad Request: message is too long", outbox.store.authority)
    assert [h.id for h in await outbox.repo.heads(Target(CHAT, 5))] == [third]


async def test_topics_summarise_the_pending_rows_of_each_topic(outbox: Outbox):
    a1 = await outbox.add(thread=5, units=10)
    await outbox.add(thread=5, units=7)
    general = await outbox.add(thread=None, key=B, units=3)
    sent = await outbox.add(thread=6, units=100)
    await outbox.repo.mark_sent([sent], 2_000, 1, outbox.store.authority)
    summary = {(t.chat_id, t.thread_id): t for t in await outbox.repo.topics()}
    assert summary == {(CHAT, 5): TopicBacklog(CHAT, 5, 2, 17, a1), (CHAT, None): TopicBacklog(CHAT, None, 1, 3, general)}
    await outbox.repo.mark_sent([a1], 2_000, 2, outbox.store.authority)
    summary = {(t.chat_id, t.thread_id): t for t in await outbox.repo.topics()}
    assert summary[(CHAT, 5)].head_id == a1 + 1 and summary[(CHAT, 5)].items == 1


# --- outcomes ---------------------------------------------------------------------------------------

async def test_the_rows_of_one_message_are_marked_sent_together_and_only_from_pending(outbox: Outbox):
    authority = outbox.store.authority
    chunks = [await outbox.add() for _ in range(3)]
    failed = await outbox.add()
    await outbox.repo.mark_failed(failed, "refused", authority)
    await outbox.repo.mark_sent([*chunks, failed], 2_000, 501, authority)
    for item_id in chunks:
        row = await outbox.row(item_id)
        assert (row["status"], row["message_id"], row["sent_at_ms"], row["attempts"]) == ("sent", 501, 2_000, 1)
    assert (await outbox.row(failed))["status"] == "failed"  # a failed row is not revived
    assert (await outbox.row(failed))["attempts"] == 1
    await outbox.repo.mark_sent(chunks[:1], 3_000, 999, authority)  # a second acceptance changes nothing
    row = await outbox.row(chunks[0])
    assert (row["message_id"], row["sent_at_ms"], row["attempts"]) == (501, 2_000, 1)


async def test_attempts_are_counted_and_errors_kept_to_500_characters(outbox: Outbox):
    authority = outbox.store.authority
    retried, failing = await outbox.add(), await outbox.add()
    await outbox.repo.note_attempt(retried, "Too Many Requests: retry after 3", authority)
    await outbox.repo.note_attempt(retried, "x" * 600, authority)
    row = await outbox.row(retried)
    assert (row["status"], row["attempts"], row["last_error"]) == ("pending", 2, "x" * 500)
    await outbox.repo.mark_failed(failing, "y" * 501, authority)
    row = await outbox.row(failing)
    assert (row["status"], row["attempts"], row["last_error"]) == ("failed", 1, "y" * 500)
    assert await outbox.repo.count_pending() == 1
    sent = await outbox.add()
    await outbox.repo.mark_sent([sent], 2_000, 9, authority)
    await outbox.repo.mark_failed(sent, "late failure", authority)  # a sent row stays sent
    assert (await outbox.row(sent))["status"] == "sent"


async def test_only_pending_rows_no_binding_can_carry_fail_when_their_topic_is_gone(outbox: Outbox):
    store = outbox.store
    await bind(store, A, 5)
    hint = await outbox.add(key="hint:-1001234567890:5", kind="notice", thread=5)
    bound = await outbox.add(key=A, thread=5)  # its binding takes it to a new topic instead
    elsewhere = await outbox.add(key="hint:-1001234567890:6", kind="notice", thread=6)
    old_hint = await outbox.add(key="hint:-1001234567890:5", kind="notice", thread=5)
    await outbox.repo.mark_sent([old_hint], 2_000, 3, store.authority)
    assert await outbox.repo.fail_unbound(Target(CHAT, 5), "topic gone", store.authority) == 1
    assert await outbox.status() == {hint: "failed", bound: "pending", elsewhere: "pending", old_hint: "sent"}
    assert (await outbox.row(hint))["last_error"] == "topic gone"
    assert await outbox.repo.fail_unbound(Target(CHAT, 5), "topic gone", store.authority) == 0


async def test_a_binding_moving_to_a_new_topic_takes_only_its_undelivered_rows(outbox: Outbox):
    store = outbox.store
    delivered = await outbox.add(key=A, thread=5)
    await outbox.repo.mark_sent([delivered], 2_000, 1, store.authority)
    waiting = [await outbox.add(key=A, thread=5) for _ in range(2)]
    neighbour = await outbox.add(key=B, thread=5)
    async with store.db.unit_of_work(store.authority) as uow:
        await OutboxRepository.retarget_tx(uow, A, 9)
    threads = {r["id"]: r["thread_id"] for r in await store.db.fetch_all("SELECT id, thread_id FROM outbox")}
    assert threads == {delivered: 5, waiting[0]: 9, waiting[1]: 9, neighbour: 5}
    assert [h.id for h in await outbox.repo.heads(Target(CHAT, 9))] == waiting  # still in arrival order
    assert (await outbox.repo.pending_in(Target(CHAT, 5)), await outbox.repo.pending_in(Target(CHAT, 9))) == (1, 2)


async def test_backlogs_count_pending_rows_only(outbox: Outbox):
    authority = outbox.store.authority
    a1 = await outbox.add(key=A, item=TextMessage("aaaa"))
    await outbox.add(key=A, item=TextMessage("bb"))
    b1 = await outbox.add(key=B, item=TextMessage("c"))
    await outbox.add(key="binding-c", item=TextMessage("d"), thread=6)
    await outbox.repo.mark_sent([a1], 2_000, 1, authority)
    await outbox.repo.mark_failed(b1, "refused", authority)
    assert await outbox.repo.backlog_of(A) == (1, len('{"text":"bb"}'))
    assert await outbox.repo.backlog_of(B) == (0, 0)
    assert await outbox.repo.backlog_of("unknown") == (0, 0)
    assert await outbox.repo.backlog_by_binding() == {A: (1, len('{"text":"bb"}')),
                                                       "binding-c": (1, len('{"text":"d"}'))}
    assert await outbox.repo.pending_binding_keys() == {A, "binding-c"}
    assert await outbox.repo.count_pending() == 2
    assert (await outbox.repo.pending_in(Target(CHAT, 5)), await outbox.repo.pending_in(Target(CHAT, 6))) == (1, 1)


async def test_the_purge_removes_only_sent_rows_older_than_the_cutoff_and_ids_are_never_reused(
        outbox: Outbox):
    authority = outbox.store.authority
    early, late, failed, pending = [await outbox.add() for _ in range(4)]
    await outbox.repo.mark_sent([early], 1_000, 1, authority)
    await outbox.repo.mark_sent([late], 2_000, 2, authority)
    await outbox.repo.mark_failed(failed, "refused", authority)
    assert await outbox.repo.purge_sent(2_000, authority) == 1  # strictly older than the cutoff
    assert await outbox.status() == {late: "sent", failed: "failed", pending: "pending"}
    assert await outbox.repo.purge_sent(10_000, authority) == 1
    assert set(await outbox.status()) == {failed, pending}
    async with outbox.store.db.unit_of_work(authority) as uow:  # even an empty table keeps its high-water mark
        await uow.execute("DELETE FROM outbox")
    assert await outbox.add() > pending


# --- authority ----------------------------------------------------------------------------------------

async def test_every_write_under_a_stale_authority_is_refused_and_changes_nothing(outbox: Outbox):
    store, repo = outbox.store, outbox.repo
    first, second = await outbox.add(), await outbox.add()
    await repo.mark_sent([first], 2_000, 1, store.authority)
    before = await store.rows("outbox")
    stale = await store.take_over()
    writes = [
        lambda: repo.enqueue(binding_key=A, chat_id=CHAT, thread_id=5, instance_id="inst-a", request_id="late",
                             item=TextMessage("late"), now_ms=store.clock.now_ms(), authority=stale),
        lambda: repo.enqueue(binding_key=A, chat_id=CHAT, thread_id=5, instance_id="inst-a", request_id="r1",
                             item=TextMessage(""), now_ms=store.clock.now_ms(), authority=stale),  # a retry too
        lambda: repo.mark_sent([second], 3_000, 2, stale),
        lambda: repo.mark_failed(second, "refused", stale),
        lambda: repo.note_attempt(second, "retry", stale),
        lambda: repo.fail_unbound(Target(CHAT, 5), "topic gone", stale),
        lambda: repo.purge_sent(10_000, stale),
    ]
    for write in writes:
        with pytest.raises(AuthorityLost):
            await write()
    with pytest.raises(AuthorityLost):
        async with store.db.unit_of_work(stale) as uow:
            await OutboxRepository.retarget_tx(uow, A, 9)
    assert await store.rows("outbox") == before
    await repo.mark_sent([second], 3_000, 2, store.authority)  # the successor's write goes through
    assert await repo.count_pending() == 0
