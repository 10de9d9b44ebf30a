"""Follower output into the outbox: what a follower sends is stored durably, never sent on the bus
request's path.

A follower's ``follower.send`` is stored (idempotent per request id), within the follower's outbox
cap, for its own topic only, and the outbound scheduler is woken; Telegram is never called here. A
follower that leaves gracefully ends its stream (its queued output goes as one notifying message
where it fits), and so, at the start of a term, does one whose previous leader died before posting
its last words.
"""

from __future__ import annotations

from topicbus.core.authority import AuthorityLost
from topicbus.core.clock import Clock
from topicbus.core.formatting import utf16_len
from topicbus.core.records import SendResult, TextMessage
from topicbus.core.registry import FollowerRecord
from topicbus.leader.outbound import OutboundScheduler
from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm
from topicbus.logsetup import EventJournal
from topicbus.ports.store import Store
from topicbus.protocol import ErrorCode, ProtocolError, SendRequest


class OutputIntake:
    def __init__(self, term: LeaderTerm, roster: Roster, outbound: OutboundScheduler, *, store: Store, clock: Clock,
                 events: EventJournal):
        self._term = term
        self._clock = clock
        self._events = events
        self._roster = roster
        self._outbound = outbound
        self._backlog: dict[str, list[int]] = {}  # binding key -> [items, bytes], an upper bound
        self._bindings = store.bindings
        self.outbox = store.outbox

    async def end_departed_streams(self) -> None:
        """A new term, before the outbound scheduler sends anything: output still queued for a follower's
        binding that has no owner is the end of a stream whose follower left (gracefully, after its exit
        notice, or proven dead) under the previous leader, which died before posting it. It goes as that
        leader would have sent it: one notifying message where it fits, so no ``✓`` line repeats the
        exit notice after a restart."""
        pending = await self.outbox.pending_binding_keys()
        if not pending:
            return
        owned = {owner.binding_key for owner in await self._bindings.owners()}
        for binding_key in sorted(pending - owned):
            binding = await self._bindings.get(binding_key)
            if binding is not None and binding.kind == "follower" and binding.has_live_topic:
                self._outbound.stream_ends(binding.target)

    async def accept_output(self, entry: FollowerRecord, req: SendRequest) -> SendResult:
        """Store one follower output item for its own topic (never another one), within the
        follower's outbox cap (``backlog-full`` beyond it: backpressure, nothing stored)."""
        target = entry.target
        assert target is not None
        if (req.chat_id is not None and req.chat_id != target.chat_id) or (
                req.thread_id is not None and req.thread_id != target.thread_id):
            raise ProtocolError(ErrorCode.FOREIGN_TARGET, "A follower may only post into its own topic.")
        self._roster.heartbeat(entry.instance_id, self._clock.now_ms())
        item = req.item
        key = entry.binding_key or ""
        size = self.outbox.item_size(item)
        await self._check_backlog(key, size)
        text = item if isinstance(item, TextMessage) else None
        try:
            outbox_id, added = await self.outbox.enqueue(
                binding_key=key, chat_id=target.chat_id, thread_id=target.thread_id,
                instance_id=entry.instance_id, request_id=req.request_id, item=item,
                now_ms=self._clock.now_ms(), authority=self._term.authority(),
                units=utf16_len(text.text) if text is not None else 0,
                fmt=text.format if text is not None else None, has_buttons=bool(text is not None and text.buttons))
        except AuthorityLost:
            raise ProtocolError(ErrorCode.NOT_LEADER, "Leader lost its lease while storing the message.") from None
        if added:
            counted = self._backlog.setdefault(key, [0, 0])
            counted[0] += 1
            counted[1] += size
        self._outbound.wake(target)
        return SendResult(outbox_id)

    def stream_ends(self, entry: FollowerRecord) -> None:
        """The follower leaves gracefully: its queued output is the end of its stream, sent as one
        notifying message where it fits (``core/output``)."""
        if entry.target is not None:
            self._outbound.stream_ends(entry.target)

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
