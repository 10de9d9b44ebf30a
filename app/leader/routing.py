"""Routing both ways: owner messages to their follower, follower output to the outbox.

Inbound: journal first, then deliver; an item leaves the journal only on the follower's receipt
(at-least-once, followers drop duplicates by ``deliveryId``). Inside :meth:`Router.inbound_batch`
owner messages are only queued; the whole ``getUpdates`` batch is journaled in one transaction when
the batch closes, before the poller confirms those updates.

Outbound: a follower's ``follower.send`` is stored durably (idempotent per request id) and the
outbound sender is woken; Telegram is never called on the bus request's path.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from topicbus.core.registry import FollowerRecord
from topicbus.leader.delivery import FollowerConnection
from topicbus.leader.notices import Notices
from topicbus.leader.outbound import OutboundScheduler, ScheduledGateway
from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm
from topicbus.protocol import ErrorCode, ProtocolError, SendRequest
from topicbus.core.formatting import utf16_len
from topicbus.storage.bindings import BindingRepository
from topicbus.storage.db import Authority, AuthorityLost
from topicbus.storage.journal import JournalItem, JournalRepository
from topicbus.storage.outbox import OutboxRepository

OFFLINE_NOTICE = "⏸ This agent is offline. Your message is kept and will be delivered when it reconnects."
TARGET_CACHE_LIMIT = 4096


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
                 outbound: OutboundScheduler):
        self._term = term
        self._roster = roster
        self._gateway = gateway
        self._notices = notices
        self._outbound = outbound
        self._backlog: dict[str, list[int]] = {}  # binding key -> [items, bytes], an upper bound
        self._bindings = BindingRepository(term.db)
        self.journal = JournalRepository(term.db)
        self.outbox = OutboxRepository(term.db)
        self._batch: list[tuple[int, str, dict[str, Any]]] | None = None
        self._journal_lock = asyncio.Lock()
        self._target_cache: dict[tuple[int, int], str] = {}
        self.latency = LatencyWindow()
        self.stats = {"routed": 0, "duplicates": 0, "ignored": 0}

    # --- inbound ----------------------------------------------------------------------------------
    async def route_owner_message(self, update_id: int, chat_id: int, thread_id: int,
                                  payload: dict[str, Any]) -> RouteResult:
        """Journal one owner message for the binding of its topic, then deliver it."""
        binding_key = await self._follower_binding_for(chat_id, thread_id)
        if binding_key is None:
            self.stats["ignored"] += 1
            return RouteResult(False, "unknown-topic")
        if self._batch is not None:
            self._batch.append((update_id, binding_key, payload))
            return RouteResult(True, "queued")
        items = await self._journal_and_deliver([(update_id, binding_key, payload)])
        if not items:
            return RouteResult(False, "duplicate")
        return RouteResult(True, "journaled", items[0].delivery_id)

    async def _follower_binding_for(self, chat_id: int, thread_id: int) -> str | None:
        """The follower binding that owns a topic. Thread ids are never reused by Telegram, so a
        found mapping stays true for as long as that topic can send updates; only hits are cached
        (a topic created later is looked up in the store)."""
        cached = self._target_cache.get((chat_id, thread_id))
        if cached is not None:
            return cached
        binding = await self._bindings.by_target(chat_id, thread_id)
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
        self._batch = []
        try:
            yield
            batch = self._batch
        finally:
            self._batch = None
        if batch:
            await self._journal_and_deliver(batch, received_at)

    async def _journal_and_deliver(self, rows: list[tuple[int, str, dict[str, Any]]],
                                   received_at: float | None = None) -> list[JournalItem]:
        authority = self._term.authority()
        async with self._journal_lock:  # appends and their first delivery stay in journal order
            items = await self.journal.append_many(rows, self._term.now_ms(), authority)
            self.stats["routed"] += len(items)
            self.stats["duplicates"] += len(rows) - len(items)
            by_binding: dict[str, list[JournalItem]] = {}
            for item in items:
                by_binding.setdefault(item.binding_key, []).append(item)
            for key, group in by_binding.items():
                if self._roster.is_routed(key):
                    await self._roster.hub.deliver_new(key, group)
                    if received_at is not None:
                        self.latency.add_many((time.perf_counter() - received_at) * 1000.0, len(group))
                else:
                    await self._notify_offline(key, authority)
        return items

    async def _notify_offline(self, binding_key: str, authority: Authority) -> None:
        async with self._term.unit_of_work(authority) as uow:
            first = await BindingRepository.set_offline_notified_tx(uow, binding_key)
        if first:
            await self._notices.post(binding_key, OFFLINE_NOTICE, authority=authority)

    async def receipt(self, connection: FollowerConnection, delivery_id: str) -> None:
        entry = self._roster.follower_on(connection)
        if entry is not None and entry.binding_key:
            await self._roster.hub.receipt(entry.binding_key, delivery_id)

    async def fetch_document(self, file_id: str) -> bytes | None:
        """The bytes of a document an owner sent, only if it was routed to a follower (the bus is
        not a general proxy for Telegram files)."""
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", file_id) or not await self.journal.has_file(file_id):
            return None
        result = await self._gateway.download(file_id)
        return result.value if result.ok else None

    # --- outbound ---------------------------------------------------------------------------------
    async def accept_output(self, entry: FollowerRecord, req: SendRequest) -> dict[str, Any]:
        """Store one follower output item for its own topic (never another one), within the
        follower's outbox cap (``backlog-full`` beyond it: backpressure, nothing stored)."""
        target = entry.target
        assert target is not None
        if (req.chat_id is not None and req.chat_id != target.chat_id) or (
                req.thread_id is not None and req.thread_id != target.thread_id):
            raise ProtocolError(ErrorCode.FOREIGN_TARGET, "A follower may only post into its own topic.")
        self._roster.registry.heartbeat(entry.instance_id, self._term.now_ms())
        message = req.message.model_dump(by_alias=True, exclude_none=True)
        kind = message.pop("type")
        key = entry.binding_key or ""
        size = len(json.dumps(message, separators=(",", ":")))
        await self._check_backlog(key, size)
        text = message.get("text") or ""
        try:
            outbox_id, added = await self.outbox.enqueue(
                binding_key=key, chat_id=target.chat_id, thread_id=target.thread_id,
                instance_id=entry.instance_id, request_id=req.request_id, kind=kind, payload=message,
                now_ms=self._term.now_ms(), authority=self._term.authority(), units=utf16_len(text),
                fmt=message.get("format"), has_buttons=bool(message.get("buttons")))
        except AuthorityLost:
            raise ProtocolError(ErrorCode.NOT_LEADER, "Leader lost its lease while storing the message.") from None
        if added:
            counted = self._backlog.setdefault(key, [0, 0])
            counted[0] += 1
            counted[1] += size
        self._outbound.wake(target.chat_id, target.thread_id)
        return {"outboxId": outbox_id}

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
