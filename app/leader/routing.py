"""Routing both ways: owner messages to their follower, follower output to the outbox.

Inbound: journal first, then deliver; an item leaves the journal only on the follower's receipt
(at-least-once, followers drop duplicates by ``deliveryId``). Inside :meth:`Router.inbound_batch`
owner messages are only queued; the whole ``getUpdates`` batch is journaled in one transaction when
the batch closes, before the poller confirms those updates. A reserved command in the batch first
flushes what was queued before it (:meth:`Router.flush_batch`), so it acts after those messages.

Albums: each part is journaled as it arrives (``gathering``), so a confirmed update is never only in
memory. The parts of one ``media_group_id`` are sealed into one ``media`` item about
:data:`ALBUM_WINDOW_S` after the last part arrived (a one-shot timer per album, pushed back by each
part). Telegram's albums have 10 parts at most, but no part of a longer one is dropped: once
``MAX_MEDIA_FILES`` parts gather they are sealed at once, and every run of that many parts is one
item. Delivery stops at a gathering part, so nothing after the album overtakes it. A term that
starts with albums still gathering (its predecessor crashed) seals them one window after it starts
(:meth:`Router.start`), so late parts that Telegram sends again still join their album. Sealing is
one transaction, so the album is delivered once.

Outbound: a follower's ``follower.send`` is stored durably (idempotent per request id) and the
outbound sender is woken; Telegram is never called on the bus request's path.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from loguru import logger

from topicbus.bot.gateway import FileStream
from topicbus.core.records import EditItem, InboundItem, SendResult, TextMessage
from topicbus.core.registry import FollowerRecord
from topicbus.core.startup import StartupWindow, Timers
from topicbus.leader.delivery import FollowerConnection
from topicbus.leader.inbound import combine_album, too_large_files, too_large_notice
from topicbus.leader.notices import Notices
from topicbus.leader.outbound import OutboundScheduler, ScheduledGateway
from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm
from topicbus.leader.topics import TopicsBeingBound
from topicbus.leader.transcription import TRANSCRIBE, Cause, Transcriber
from topicbus.core.formatting import utf16_len
from topicbus.protocol import CAP_EDIT, MAX_MEDIA_FILES, ErrorCode, ProtocolError, SendRequest
from topicbus.storage.bindings import BindingRepository
from topicbus.storage.db import Authority, AuthorityLost, UnitOfWork
from topicbus.storage.journal import JournalItem, JournalRepository
from topicbus.storage.outbox import OutboxRepository

# A follower whose socket dropped (not pruned: its heartbeats were recent) reconnects within seconds;
# an owner message meanwhile tells the owner it is offline only if it is still absent after this
# (the composition root passes FOLLOWER_STALE_AFTER_MS).
RECONNECT_GRACE_S = 15.0
OFFLINE_NOTICE = ("⏸ This agent is offline. Your message is kept and will be delivered when it reconnects. "
                  "/queue lists what waits, /drop discards it.")
EDITS_NOT_TAKEN = ("✏️ This agent does not take edits: it keeps the message as you first sent it. "
                   "Send the corrected text as a new message.")
TARGET_CACHE_LIMIT = 4096
ALBUM_WINDOW_S = 1.0  # an album is sealed this long after its last part arrived
ALBUM_JOB_PREFIX = "topicbus.album:"

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


class Router:
    def __init__(self, term: LeaderTerm, roster: Roster, gateway: ScheduledGateway, notices: Notices,
                 outbound: OutboundScheduler, *, timers: Timers | None = None,
                 album_window_s: float = ALBUM_WINDOW_S, being_bound: TopicsBeingBound | None = None,
                 transcriber: Transcriber | None = None, startup: StartupWindow | None = None,
                 reconnect_grace_s: float = RECONNECT_GRACE_S):
        self._term = term
        # After a leader start, agents are still reconnecting: no one is told an agent is offline
        # until the startup window ends, and then only about agents still absent.
        self._startup = startup
        self._reconnect_grace_s = reconnect_grace_s
        self._offline_due: set[str] = set()
        if startup is not None:
            startup.when_settled(self._notify_still_absent)
        self._being_bound = being_bound or TopicsBeingBound()
        self._transcriber = transcriber
        self._timers = timers
        self._album_window_s = album_window_s
        self._edit_noticed: set[tuple[str, str]] = set()  # (binding, generation) told that edits are not taken
        self._roster = roster
        self._gateway = gateway
        self._notices = notices
        self._outbound = outbound
        self._backlog: dict[str, list[int]] = {}  # binding key -> [items, bytes], an upper bound
        self._bindings = BindingRepository(term.db)
        self.journal = JournalRepository(term.db)
        self.outbox = OutboxRepository(term.db)
        self._batch: list[Row] | None = None
        self._batch_received_at: float | None = None
        self._journal_lock = asyncio.Lock()
        self._target_cache: dict[tuple[int, int], str] = {}
        self.latency = LatencyWindow()
        self.stats = {"routed": 0, "duplicates": 0, "ignored": 0}

    # --- inbound ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """A new term: albums left gathering by the previous leader are sealed one window from now."""
        for binding_key, group in await self.journal.gathering_groups():
            self._schedule_seal(binding_key, group)

    async def end_departed_streams(self) -> None:
        """A new term, before the outbound scheduler sends anything: output still queued for a follower's binding that has no owner is the end of a stream whose
        follower left (gracefully, after its exit notice, or proven dead) under the previous leader,
        which died before posting it. It goes as that leader would have sent it: one notifying
        message where it fits, so no ``✓`` line repeats the exit notice after a restart."""
        pending = await self.outbox.pending_binding_keys()
        if not pending:
            return
        owned = {owner.binding_key for owner in await self._bindings.owners()}
        for binding_key in sorted(pending - owned):
            binding = await self._bindings.get(binding_key)
            if binding is not None and binding.kind == "follower" and binding.has_live_topic:
                self._outbound.stream_ends(binding.chat_id, binding.thread_id)

    async def route_owner_message(self, update_id: int, chat_id: int, thread_id: int,
                                  payload: InboundItem, *, media_group: str | None = None) -> RouteResult:
        """Journal one owner item (message, media, edit) for the binding of its topic, then deliver
        it. ``media_group``: the album this part belongs to (delivered with its album, once)."""
        binding_key = await self.binding_for_topic(chat_id, thread_id)
        if binding_key is None:
            self.stats["ignored"] += 1
            return RouteResult(False, "unknown-topic")
        row: Row = (update_id, binding_key, payload, media_group or None)
        if self._batch is not None:
            self._batch.append(row)
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

    async def binding_for_topic(self, chat_id: int, thread_id: int) -> str | None:
        """The follower binding that owns a topic. Thread ids are never reused by Telegram, so a
        found mapping stays true for as long as that topic can send updates; only hits are cached
        (a topic created later is looked up in the store).

        A topic not found while a registration runs may be the one it is creating: Telegram can
        send its first message before the binding commits. Then the lookup is repeated once every
        registration running has finished, so that message is routed, not dropped."""
        cached = self._target_cache.get((chat_id, thread_id))
        if cached is not None:
            return cached
        mark = self._being_bound.mark()
        binding = await self._bindings.by_target(chat_id, thread_id)
        if binding is None and self._being_bound.may_have_bound_since(mark):
            log = logger.bind(phase="routing")
            log.debug("a message in thread {} waits for the registrations running", thread_id)
            await self._being_bound.settled()
            binding = await self._bindings.by_target(chat_id, thread_id)
            log.debug("a message in thread {} waited for the registrations running: {}", thread_id,
                      "bound" if binding is not None else "still no binding")
        if binding is None or binding.kind != "follower":
            return None
        if len(self._target_cache) > TARGET_CACHE_LIMIT:
            self._target_cache.clear()
        self._target_cache[(chat_id, thread_id)] = binding.binding_key
        return binding.binding_key

    @asynccontextmanager
    async def inbound_batch(self, received_at: float | None = None) -> AsyncIterator[None]:
        """Collect the owner messages of one getUpdates batch and journal them together.
        ``received_at`` (perf_counter) is when the batch arrived, for the route-latency figure."""
        self._batch, self._batch_received_at = [], received_at
        try:
            yield
            batch = self._batch
        finally:
            self._batch = None
        if batch:
            await self._journal_and_deliver(batch, received_at)

    def batch_age_s(self) -> float:
        """How long ago the getUpdates batch being handled arrived (0 outside a batch): an update's
        age when its handler runs (a press's answer is due about 15 s after it arrived)."""
        if self._batch is None or self._batch_received_at is None:
            return 0.0
        return max(0.0, time.perf_counter() - self._batch_received_at)

    async def flush_batch(self) -> None:
        """Journal and deliver the owner messages queued so far in this batch, now: a reserved
        command then acts after the messages sent before it. Outside a batch: nothing to do."""
        if self._batch:
            rows = list(self._batch)
            await self._journal_and_deliver(rows, self._batch_received_at)
            # Only once journaled: if that failed, the rows stay in the batch, whose close journals
            # them again (duplicates are dropped by update id) or does not confirm the batch.
            del self._batch[:len(rows)]

    async def _journal_and_deliver(self, rows: list[Row], received_at: float | None = None) -> list[JournalItem]:
        authority = self._term.authority()
        # Voice notes to transcribe are journaled held: delivery stops there until the transcript is in.
        verdicts = {row[0]: verdict for row in rows if (verdict := self._voice_verdict(row)) is not None}
        async with self._journal_lock:  # appends and their first delivery stay in journal order
            items = await self.journal.append_many(rows, self._term.now_ms(), authority,
                                                   held={u for u, v in verdicts.items() if v == TRANSCRIBE})
            self.stats["routed"] += len(items)
            self.stats["duplicates"] += len(rows) - len(items)
            by_binding: dict[str, list[JournalItem]] = {}
            for item in items:
                by_binding.setdefault(item.binding_key, []).append(item)
            full = []
            for key, group_id in dict.fromkeys((i.binding_key, i.media_group) for i in items if i.media_group):
                if await self._album_part_added(key, group_id):
                    full.append((key, group_id))
            for key, group in by_binding.items():
                if self._roster.is_routed(key):
                    await self._roster.hub.deliver_new(key, group)
                    if received_at is not None:
                        self.latency.add_many((time.perf_counter() - received_at) * 1000.0, len(group))
                elif self._startup is not None and not self._startup.settled:
                    self._offline_due.add(key)  # its reconnect is due: told only if it is still absent
                elif self._roster.reconnect_due(key) and self._timers is not None:
                    # Its socket dropped, but it was not pruned: follow reconnects within seconds, so
                    # the owner is told only if it is still absent when that grace is over.
                    self._timers.once(f"topicbus.offline:{key}", self._reconnect_grace_s,
                                      functools.partial(self._notify_if_still_absent, key))
                else:
                    await self._notify_offline(key, authority)
            for key, group_id in full:
                await self._seal(key, group_id)
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
                          claim: Callable[[UnitOfWork], Awaitable[bool]]) -> JournalItem | None:
        """Journal a generation-bound item (a button press) for one follower process, in the same
        transaction as ``claim`` (which records that the press was taken: the two commit together or
        not at all), then deliver it. None when ``claim`` refused or the update was journaled before.
        What the owner sent before it in this ``getUpdates`` batch is journaled and delivered first."""
        await self.flush_batch()
        authority = self._term.authority()
        async with self._journal_lock:  # appends and their first delivery stay in journal order
            async with self._term.unit_of_work(authority) as uow:
                if not await claim(uow):
                    return None
                item = await JournalRepository.append_tx(uow, update_id, binding_key, payload, self._term.now_ms(),
                                                         for_instance=for_instance)
            if item is None:
                return None
            self.stats["routed"] += 1
            if self._roster.is_routed(binding_key):
                await self._roster.hub.deliver_new(binding_key, [item])
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

    # --- albums -----------------------------------------------------------------------------------
    async def _album_part_added(self, binding_key: str, group: str) -> bool:
        """Push the album's seal back by one window; True when it is to be sealed now (it is full)."""
        if self._timers is None or await self.journal.count_gathering(binding_key, group) >= MAX_MEDIA_FILES:
            if self._timers is not None:
                self._timers.cancel(self._album_job(binding_key, group))
            return True
        self._schedule_seal(binding_key, group)
        return False

    @staticmethod
    def _album_job(binding_key: str, group: str) -> str:
        return f"{ALBUM_JOB_PREFIX}{binding_key}:{group}"

    def _schedule_seal(self, binding_key: str, group: str) -> None:
        if self._timers is None:
            return
        self._timers.once(self._album_job(binding_key, group), self._album_window_s,
                          lambda: self._seal(binding_key, group))

    async def _seal(self, binding_key: str, group: str) -> None:
        """Fold an album's parts into one item (one transaction), then deliver it."""
        try:
            sealed = await self.journal.seal_group(binding_key, group, combine_album, self._term.now_ms(),
                                                   self._term.authority(), parts_per_item=MAX_MEDIA_FILES)
        except AuthorityLost:
            return  # the next leader seals it when its term starts
        except Exception as exc:  # noqa: BLE001 - storage trouble: try again one window later
            logger.bind(phase="album").warning("album not sealed yet ({}); retrying", type(exc).__name__)
            self._schedule_seal(binding_key, group)
            return
        if sealed and self._roster.is_routed(binding_key):
            await self._roster.hub.kick(binding_key)

    async def _notify_if_still_absent(self, binding_key: str) -> None:
        """A follower's reconnect grace is over: the offline notice, if it did not come back."""
        authority = self._term.current()
        if authority is None or self._roster.is_routed(binding_key):
            return
        try:
            await self._notify_offline(binding_key, authority)
        except AuthorityLost:
            return

    async def _notify_still_absent(self) -> None:
        """The startup window ended: the offline notice for each agent a message waited for during it
        that is still absent."""
        due, self._offline_due = self._offline_due, set()
        absent = [key for key in sorted(due) if not self._roster.is_routed(key)]
        logger.bind(phase="startup").debug("startup window over: {} agent(s) had messages, {} still absent",
                                           len(due), len(absent))
        authority = self._term.current()
        if authority is None:
            return
        for key in absent:
            try:
                await self._notify_offline(key, authority)
            except AuthorityLost:
                return
            except Exception as exc:  # noqa: BLE001 - a notice is never worth failing the window's end
                self._term.events.record(exc, phase="offline-notice", level="WARNING")

    async def _notify_offline(self, binding_key: str, authority: Authority) -> None:
        async with self._term.unit_of_work(authority) as uow:
            first = await BindingRepository.set_offline_notified_tx(uow, binding_key)
        if first:
            await self._notices.post(binding_key, OFFLINE_NOTICE, authority=authority)

    async def receipt(self, connection: FollowerConnection, delivery_id: str) -> None:
        entry = self._roster.follower_on(connection)
        if entry is not None and entry.binding_key:
            await self._roster.hub.receipt(entry.binding_key, delivery_id)

    @asynccontextmanager
    async def open_document(self, file_id: str) -> AsyncIterator[FileStream | None]:
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

    # --- outbound ---------------------------------------------------------------------------------
    async def accept_output(self, entry: FollowerRecord, req: SendRequest) -> SendResult:
        """Store one follower output item for its own topic (never another one), within the
        follower's outbox cap (``backlog-full`` beyond it: backpressure, nothing stored)."""
        target = entry.target
        assert target is not None
        if (req.chat_id is not None and req.chat_id != target.chat_id) or (
                req.thread_id is not None and req.thread_id != target.thread_id):
            raise ProtocolError(ErrorCode.FOREIGN_TARGET, "A follower may only post into its own topic.")
        self._roster.registry.heartbeat(entry.instance_id, self._term.now_ms())
        item = req.item
        key = entry.binding_key or ""
        size = self.outbox.size_of(item)
        await self._check_backlog(key, size)
        text = item if isinstance(item, TextMessage) else None
        try:
            outbox_id, added = await self.outbox.enqueue(
                binding_key=key, chat_id=target.chat_id, thread_id=target.thread_id,
                instance_id=entry.instance_id, request_id=req.request_id, item=item,
                now_ms=self._term.now_ms(), authority=self._term.authority(),
                units=utf16_len(text.text) if text is not None else 0,
                fmt=text.format if text is not None else None, has_buttons=bool(text is not None and text.buttons))
        except AuthorityLost:
            raise ProtocolError(ErrorCode.NOT_LEADER, "Leader lost its lease while storing the message.") from None
        if added:
            counted = self._backlog.setdefault(key, [0, 0])
            counted[0] += 1
            counted[1] += size
        self._outbound.wake(target.chat_id, target.thread_id)
        return SendResult(outbox_id)

    def stream_ends(self, entry: FollowerRecord) -> None:
        """The follower leaves gracefully: its queued output is the end of its stream, sent as one
        notifying message where it fits (``core/output``)."""
        if entry.target is not None:
            self._outbound.stream_ends(entry.target.chat_id, entry.target.thread_id)

    async def _check_backlog(self, binding_key: str, size: int) -> None:
        """The in-memory count only ever over-estimates (sent rows are not subtracted); when it says
        "full", the store says whether that is still true."""
        options = self._outbound.options
        counted = self._backlog.get(binding_key)
        if counted is None or counted[0] + 1 > options.max_items or counted[1] + size > options.max_bytes:
            items, size_now = await self.outbox.backlog_of(binding_key)
            counted = self._backlog[binding_key] = [items, size_now]
        if counted[0] + 1 > options.max_items or counted[1] + size > options.max_bytes:
            raise ProtocolError(ErrorCode.BACKLOG_FULL,
                                f"This follower's outbox is full ({counted[0]} items, {counted[1]} bytes waiting "
                                f"for Telegram); retry later.")

    # --- housekeeping -----------------------------------------------------------------------------
    async def purge_history(self, keep_ms: int) -> tuple[int, int]:
        """Drop delivered journal items and sent output older than ``keep_ms``."""
        authority = self._term.authority()
        cutoff = self._term.now_ms() - keep_ms
        return (await self.journal.purge_delivered(cutoff, authority),
                await self.outbox.purge_sent(cutoff, authority))
