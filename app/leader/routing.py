"""Routing owner messages to their follower.

Journal first, then deliver; an item leaves the journal only on the follower's receipt
(at-least-once, followers drop duplicates by ``deliveryId``). A ``getUpdates`` answer is an
:class:`InboundBatch`, an explicit object the handlers pass to the router: owner messages routed with
a batch are only queued in it, and the whole batch is journaled in one transaction when it closes
(:meth:`InboundBatches.open`), before the poller confirms those updates. A reserved command in the
batch first flushes what was queued before it (:meth:`Router.flush`), so it acts after those messages.


Follower output goes the other way, into the outbox: ``leader/output_intake``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from loguru import logger

from topicbus.core.records import EditItem, InboundItem, SendResult, TextMessage
from topicbus.core.target import Target
from topicbus.ports.store import Store, UnitOfWork
from topicbus.core.clock import Clock
from topicbus.logsetup import EventJournal
from topicbus.ports.telegram import FileDownload
from topicbus.core.registry import FollowerRecord
from topicbus.leader.albums import Albums
from topicbus.leader.delivery import DeliveryHub
from topicbus.ports.bus import FollowerConnection
from topicbus.leader.inbound import too_large_files, too_large_notice
from topicbus.leader.notices import Notices
from topicbus.leader.offline import OfflineNotices
from topicbus.leader.outbound import ScheduledGateway
from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm
from topicbus.leader.topics import TopicsBeingBound
from topicbus.leader.transcription import TRANSCRIBE, Cause, Transcriber
from topicbus.protocol import CAP_EDIT
from topicbus.core.authority import Authority, AuthorityLost
from topicbus.core.journal import JournalItem

EDITS_NOT_TAKEN = ("✏️ This agent does not take edits: it keeps the message as you first sent it. "
                   "Send the corrected text as a new message.")
TARGET_CACHE_LIMIT = 4096

Row = tuple[int, str, InboundItem, str | None]  # update id, binding key, payload, media group


class LatencyWindow:
    """The last 256 route latencies (ms): getUpdates answer received → delivery frame written."""

    def __init__(self, size: int = 256):
        self._values: deque[float] = deque(maxlen=size)

    def add_many(self, value_ms: float, count: int = 1) -> None:
        self._values.extend([value_ms] * count)

    def quantile(self, q: float) -> float | None:
        if not self._values:
            return None
        ordered = sorted(self._values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class RouteResult:
    routed: bool
    reason: str
    delivery_id: str | None = None


class InboundBatch:
    """The owner messages of one ``getUpdates`` answer, queued to be journaled together.
    ``received_at`` (perf_counter) is when the answer arrived, for the route-latency figure."""

    def __init__(self, received_at: float | None = None):
        self.rows: list[Row] = []
        self.received_at = received_at

    def age_s(self) -> float:
        """How long ago the ``getUpdates`` answer arrived: an update's age when its handler runs (a
        press's answer is due about 15 s after it arrived)."""
        if self.received_at is None:
            return 0.0
        return max(0.0, time.perf_counter() - self.received_at)


class Router:
    def __init__(self, term: LeaderTerm, roster: Roster, delivery: DeliveryHub, gateway: ScheduledGateway,
                 notices: Notices, *, albums: Albums, offline: OfflineNotices,
                 being_bound: TopicsBeingBound | None = None, transcriber: Transcriber | None = None,
                 store: Store, clock: Clock, events: EventJournal):
        self._term = term
        self._store = store
        self._clock = clock
        self._events = events
        self._albums = albums
        self._offline = offline
        self._being_bound = being_bound or TopicsBeingBound()
        self._transcriber = transcriber
        self._edit_noticed: set[tuple[str, str]] = set()  # (binding, generation) told that edits are not taken
        self._roster = roster
        self._delivery = delivery
        self._gateway = gateway
        self._notices = notices
        self._bindings = store.bindings
        self.journal = store.journal
        self.outbox = store.outbox
        self._journal_lock = asyncio.Lock()
        self._target_cache: dict[Target, str] = {}
        self.latency = LatencyWindow()
        self.stats = {"routed": 0, "duplicates": 0, "ignored": 0}

    # --- inbound ----------------------------------------------------------------------------------
    @property
    def routed(self) -> int:
        """Owner items routed (journaled for a follower) in this term."""
        return self.stats["routed"]

    async def route_owner_message(self, update_id: int, chat_id: int, thread_id: int,
                                  payload: InboundItem, *, media_group: str | None = None,
                                  batch: InboundBatch | None = None) -> RouteResult:
        """Journal one owner item (message, media, edit) for the binding of its topic, then deliver
        it; with a ``batch``, only queue it there (journaled when the batch is flushed or closes).
        ``media_group``: the album this part belongs to (delivered with its album, once)."""
        binding_key = await self.binding_for_topic(Target(chat_id, thread_id))
        if binding_key is None:
            self.stats["ignored"] += 1
            return RouteResult(False, "unknown-topic")
        row: Row = (update_id, binding_key, payload, media_group or None)
        if batch is not None:
            batch.rows.append(row)
            return RouteResult(True, "queued")
        items = await self._journal_and_deliver([row])
        if not items:
            return RouteResult(False, "duplicate")
        return RouteResult(True, "journaled", items[0].delivery_id)

    def live_follower(self, binding_key: str) -> FollowerRecord | None:
        """The follower that registered with this leader for a binding and is routed now."""
        if not self._roster.is_routed(binding_key):
            return None
        for record in self._roster.followers():
            if record.binding_key == binding_key and not self._roster.is_restored(record.instance_id):
                return record
        return None

    async def binding_for_topic(self, topic: Target) -> str | None:
        """The follower binding that owns a topic. Thread ids are never reused by Telegram, so a
        found mapping stays true for as long as that topic can send updates; only hits are cached
        (a topic created later is looked up in the store).

        A topic not found while a registration runs may be the one it is creating: Telegram can
        send its first message before the binding commits. Then the lookup is repeated once every
        registration running has finished, so that message is routed, not dropped."""
        cached = self._target_cache.get(topic)
        if cached is not None:
            return cached
        mark = self._being_bound.mark()
        binding = await self._bindings.by_target(topic)
        if binding is None and self._being_bound.may_have_bound_since(mark):
            log = logger.bind(phase="routing")
            log.debug("a message in thread {} waits for the registrations running", topic.thread_id)
            await self._being_bound.settled()
            binding = await self._bindings.by_target(topic)
            log.debug("a message in thread {} waited for the registrations running: {}", topic.thread_id,
                      "bound" if binding is not None else "still no binding")
        if binding is None or binding.kind != "follower":
            return None
        if len(self._target_cache) > TARGET_CACHE_LIMIT:
            self._target_cache.clear()
        self._target_cache[topic] = binding.binding_key
        return binding.binding_key

    async def flush(self, batch: InboundBatch | None) -> None:
        """Journal and deliver the owner messages queued so far in ``batch``, now: a reserved
        command then acts after the messages sent before it. Without a batch: nothing to do."""
        if batch is not None and batch.rows:
            rows = list(batch.rows)
            await self._journal_and_deliver(rows, batch.received_at)
            # Only once journaled: if that failed, the rows stay in the batch, whose close journals
            # them again (duplicates are dropped by update id) or does not confirm the batch.
            del batch.rows[:len(rows)]

    async def _journal_and_deliver(self, rows: list[Row], received_at: float | None = None) -> list[JournalItem]:
        authority = self._term.authority()
        # Voice notes to transcribe are journaled held: delivery stops there until the transcript is in.
        verdicts = {row[0]: verdict for row in rows if (verdict := self._voice_verdict(row)) is not None}
        async with self._journal_lock:  # appends and their first delivery stay in journal order
            items = await self.journal.append_many(rows, self._clock.now_ms(), authority,
                                                   held={u for u, v in verdicts.items() if v == TRANSCRIBE})
            self.stats["routed"] += len(items)
            self.stats["duplicates"] += len(rows) - len(items)
            by_binding: dict[str, list[JournalItem]] = {}
            for item in items:
                by_binding.setdefault(item.binding_key, []).append(item)
            full = []
            for key, group_id in dict.fromkeys((i.binding_key, i.media_group) for i in items if i.media_group):
                if await self._albums.part_added(key, group_id):
                    full.append((key, group_id))
            for key, group in by_binding.items():
                if self._roster.is_routed(key):
                    await self._delivery.deliver_new(key, group)
                    if received_at is not None:
                        self.latency.add_many((time.perf_counter() - received_at) * 1000.0, len(group))
                else:
                    await self._offline.message_waits(key, authority)
            for key, group_id in full:
                await self._albums.seal(key, group_id)
        for item in items:
            await self._tell_owner(item, authority)
            verdict = verdicts.get(item.update_id)
            if verdict == TRANSCRIBE and self._transcriber is not None:
                self._transcriber.begin(item)
            elif isinstance(verdict, Cause) and self._transcriber is not None:
                await self._transcriber.tell(item.binding_key, verdict)
        return items

    def _voice_verdict(self, row: Row) -> str | None:
        """What becomes of a voice note (``leader/transcription``); None for anything else (an album
        part included)."""
        if self._transcriber is None or row[3]:
            return None
        return self._transcriber.verdict(row[2])

    async def route_bound(self, update_id: int, binding_key: str, payload: InboundItem, *, for_instance: str,
                          claim: Callable[[UnitOfWork], Awaitable[bool]],
                          batch: InboundBatch | None = None) -> JournalItem | None:
        """Journal a generation-bound item (a button press) for one follower process, in the same
        transaction as ``claim`` (which records that the press was taken: the two commit together or
        not at all), then deliver it. None when ``claim`` refused or the update was journaled before.
        What the owner sent before it in its ``batch`` is journaled and delivered first."""
        await self.flush(batch)
        authority = self._term.authority()
        async with self._journal_lock:  # appends and their first delivery stay in journal order
            async with self._store.unit_of_work(authority) as uow:
                if not await claim(uow):
                    return None
                item = await uow.journal.append(update_id, binding_key, payload, self._clock.now_ms(),
                                                         for_instance=for_instance)
            if item is None:
                return None
            self.stats["routed"] += 1
            if self._roster.is_routed(binding_key):
                await self._delivery.deliver_new(binding_key, [item])
        return item

    async def _tell_owner(self, item: JournalItem, authority: Authority) -> None:
        """What the topic must know about an item just journaled: files too large for the agent,
        and an edit that the live follower will not take."""
        files = too_large_files(item.payload)
        if files:
            await self._notices.post(item.binding_key, too_large_notice(files), authority=authority)
        if isinstance(item.payload, EditItem):
            record = self.live_follower(item.binding_key)
            if record is not None and CAP_EDIT not in record.capabilities:
                told = (item.binding_key, record.registration_generation)
                if told not in self._edit_noticed:
                    self._edit_noticed.add(told)
                    await self._notices.post(item.binding_key, EDITS_NOT_TAKEN, authority=authority)

    async def receipt(self, connection: FollowerConnection, delivery_id: str) -> None:
        entry = self._roster.follower_on(connection)
        if entry is not None and entry.binding_key:
            await self._delivery.receipt(entry.binding_key, delivery_id)

    @asynccontextmanager
    async def open_document(self, file_id: str) -> AsyncIterator[FileDownload | None]:
        """The bytes of a document an owner sent, streamed from Telegram while the block runs; only
        if it was routed to a follower (the bus is not a general proxy for Telegram files). None
        when it was not, or Telegram does not give it (unknown, over 20 MB, unreachable)."""
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", file_id) or not await self.journal.has_file(file_id):
            yield None
            return
        async with self._gateway.open_download(file_id) as result:
            if not result.ok:
                logger.bind(phase="files").info("file {} not served: {} ({})", file_id, result.outcome.value,
                                                result.message)
            yield result.value if result.ok else None

    # --- housekeeping -----------------------------------------------------------------------------
    async def purge_history(self, keep_ms: int) -> tuple[int, int]:
        """Drop delivered journal items and sent output older than ``keep_ms``."""
        authority = self._term.authority()
        cutoff = self._clock.now_ms() - keep_ms
        return (await self.journal.purge_delivered(cutoff, authority),
                await self.outbox.purge_sent(cutoff, authority))


class InboundBatches:
    """The ``getUpdates`` answer whose updates the handlers are running now: the poller opens an
    :class:`InboundBatch` around each answer (:meth:`open`), and the handlers pass ``current`` to the
    router with each owner message. Between answers ``current`` is None (the router then journals a
    message at once)."""

    def __init__(self, router: Router):
        self._router = router
        self.current: InboundBatch | None = None

    @asynccontextmanager
    async def open(self, received_at: float | None = None) -> AsyncIterator[InboundBatch]:
        """One answer's batch, journaled (what is left of it) when the block ends without an error;
        after an error nothing is journaled and the poller does not confirm the answer."""
        batch = InboundBatch(received_at)
        self.current = batch
        try:
            yield batch
        finally:
            self.current = None
        await self._router.flush(batch)
