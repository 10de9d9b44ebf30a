"""Outbound delivery of follower output: durable outbox → Telegram, in order per topic.

Each topic has at most one worker; a topic that hits flood control (``RetryAfter``) or an ambiguous
failure pauses alone while other topics keep flowing. Nothing is dropped: an item leaves the
outbox only when Telegram accepted it, or when Telegram rejected it for good (logged).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable

from topicbus.bot.gateway import CallResult, Outcome, TelegramGateway
from topicbus.leader.term import LeaderTerm
from topicbus.retry import Backoff
from topicbus.storage.outbox import OutboxItem, OutboxRepository

MAX_BACKOFF_S = 30.0
IDLE_RESCAN_S = 5.0
MAX_BROKEN_ATTEMPTS = 3

TargetKey = tuple[int, int | None]


class OutboundSender:
    def __init__(self, term: LeaderTerm, gateway: TelegramGateway,
                 on_topic_gone: Callable[[int, int], Awaitable[None]]):
        self._term = term
        self._repo = OutboxRepository(term.db)
        self._gateway = gateway
        self._events = term.events
        self._on_topic_gone = on_topic_gone
        self._wake = asyncio.Event()
        self._workers: dict[TargetKey, asyncio.Task[None]] = {}
        self._paused_until: dict[TargetKey, float] = {}
        self._backoff: dict[TargetKey, Backoff] = {}
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.retry_after_hits = 0


    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="outbound-sender")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._workers.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        self._workers.clear()

    def paused_targets(self) -> dict[TargetKey, float]:
        now = time.monotonic()
        return {k: round(v - now, 3) for k, v in self._paused_until.items() if v > now}

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                items = await self._repo.pending()
            except Exception as exc:  # noqa: BLE001 - storage trouble: wait and rescan
                self._events.record(exc, phase="outbox-scan", level="WARNING")
                items = []
            now = time.monotonic()
            groups: dict[TargetKey, list[OutboxItem]] = {}
            for item in items:
                groups.setdefault((item.chat_id, item.thread_id), []).append(item)
            for key, group in groups.items():
                if key in self._workers or self._paused_until.get(key, 0) > now:
                    continue
                self._workers[key] = asyncio.create_task(self._drain(key, group), name=f"outbox:{key}")
            waits = [v - now for k, v in self._paused_until.items() if v > now and k in groups]
            timeout = max(0.01, min([IDLE_RESCAN_S, *waits]))
            try:
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives as the
                # event is set (gh-86296), and stop() would then wait for this task for ever.
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _drain(self, key: TargetKey, group: list[OutboxItem]) -> None:
        current: OutboxItem | None = None
        try:
            for item in group:
                current = item
                result = await self._send(item)
                if result.ok:
                    await self._repo.mark_sent(item.id, self._term.now_ms(), self._term.authority())
                    self.sent += 1
                    self._backoff.pop(key, None)
                    continue
                if result.outcome is Outcome.RETRY_AFTER:
                    self.retry_after_hits += 1
                    self._pause(key, result.retry_after_s + 0.05)
                    self._events.record("Telegram flood control; topic paused", phase="outbox-retry-after",
                                        level="WARNING", chatId=key[0], threadId=key[1],
                                        retryAfterS=result.retry_after_s)
                    await self._repo.note_attempt(item.id, f"retry-after {result.retry_after_s}s",
                                                  self._term.authority())
                    return
                if result.outcome is Outcome.AMBIGUOUS:
                    backoff = self._backoff.setdefault(key, Backoff(initial=0.5, maximum=MAX_BACKOFF_S))
                    self._pause(key, backoff.next())
                    await self._repo.note_attempt(item.id, f"ambiguous: {result.message}", self._term.authority())
                    return
                if result.outcome is Outcome.GONE and key[1] is not None:
                    await self._repo.note_attempt(item.id, "topic gone", self._term.authority())
                    self._pause(key, MAX_BACKOFF_S)
                    await self._on_topic_gone(key[0], key[1])
                    return
                await self._repo.mark_failed(item.id, f"{result.outcome}: {result.message}", self._term.authority())
                self._events.record("Telegram rejected follower output", phase="outbox-rejected", level="WARNING",
                                    chatId=key[0], threadId=key[1], error=result.message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - keep the sender alive
            self._events.record(exc, phase="outbox-worker", level="ERROR", chatId=key[0], threadId=key[1])
            failing = current
            if failing is not None and failing.attempts + 1 >= MAX_BROKEN_ATTEMPTS:
                # An item that cannot even be sent (not a Telegram answer) must not block its topic.
                await self._repo.mark_failed(failing.id, f"unsendable: {type(exc).__name__}", self._term.authority())
            elif failing is not None:
                await self._repo.note_attempt(failing.id, f"unsendable: {type(exc).__name__}", self._term.authority())
            self._pause(key, 1.0)
        finally:
            if self._workers.get(key) is asyncio.current_task():
                del self._workers[key]
            self._wake.set()

    def _pause(self, key: TargetKey, seconds: float) -> None:
        self._paused_until[key] = time.monotonic() + seconds

    async def _send(self, item: OutboxItem) -> CallResult:
        p = item.payload
        if item.kind in ("text", "notice"):
            return await self._gateway.send_text(item.chat_id, item.thread_id, p["text"])
        if item.kind == "chatAction":
            return await self._gateway.send_chat_action(item.chat_id, item.thread_id, p["action"])
        if item.kind == "document":
            data = base64.b64decode(p["dataBase64"], validate=False)
            return await self._gateway.send_document(item.chat_id, item.thread_id, p["fileName"], data,
                                                     p.get("caption"))
        return CallResult(Outcome.REJECTED, f"unknown outbox kind {item.kind}")
