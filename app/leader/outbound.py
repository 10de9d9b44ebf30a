"""The outbound scheduler: one spender of the chat's Telegram budget (issue 11, SPEC §9.1).

Every outbound Bot API call of a term goes through :class:`OutboundScheduler`:

* the durable outbox (agent output and the leader's notices), topic by topic, planned by
  :func:`topicbus.core.output.plan` — coalesced messages, growing live messages, files, pings;
* other calls (topic create/edit/close/reopen/delete, probes, reactions) through :meth:`call`,
  usually via :class:`ScheduledGateway`, which has the gateway's methods with a priority each.

Inline keyboards (``leader/keyboards``): a follower's buttons go under its message; while an agent
prints, its silent stream messages, its live message (at each edit) and its output files carry the
Interrupt button. Both ride on calls that go out anyway; no call is made for a keyboard alone.

It spends :class:`~topicbus.core.budget.ChatBudget` by priority (control answers and notices, then
answers to buttons and prompts, then output, then title edits), topics in turn (least recently
served first), and pauses the whole chat for what ``RetryAfter`` says. Order inside a topic never
changes. It replaces PTB's ``AIORateLimiter`` (docs/operations.md, "The outbound budget").

Durability: the rows one Telegram message covers are marked sent in one transaction after Telegram
accepted it; a crash in between repeats at most that one message per topic.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from loguru import logger

from topicbus.bot.gateway import CallResult, Outcome, TelegramGateway
from topicbus.core.budget import BudgetConfig, ChatBudget, Priority
from topicbus.core.formatting import MAX_CAPTION, Rendered, as_plain, render, split, tail, utf16_len
from topicbus.core.output import (AsFile, Extend, Idle, NewMessage, OutputConfig, Ping, QueuedItem, Single,
                                  TopicTurn, Wait, coalescible, fitting, plan)
from topicbus.leader.keyboards import Keyboards, keys
from topicbus.leader.term import LeaderTerm
from topicbus.retry import Backoff
from topicbus.storage.db import AuthorityLost
from topicbus.storage.keyboards import Keyboard
from topicbus.storage.outbox import OutboxRepository

TopicKey = tuple[int, int | None]
HEADS = 256
FILE_HEADS = 8192
MAX_BACKOFF_S = 30.0
GONE_PAUSE_S = 30.0
CALL_DEADLINE_S = 60.0
ANSWER_DEADLINE_S = 10.0  # Telegram lets a button press be answered for a few seconds only
WAKE_DEBOUNCE_S = 0.02
SKIPPED = "skipped under pressure"


@dataclass(frozen=True)
class OutboundOptions:
    """The chat's budget, how output is shaped, and each follower's outbox cap."""

    budget: BudgetConfig = BudgetConfig()
    output: OutputConfig = OutputConfig()
    max_items: int = 1000
    max_bytes: int = 16 * 1024 * 1024


@dataclass
class _Call:
    priority: Priority
    key: TopicKey
    spends: bool
    fn: Callable[[], Awaitable[CallResult]]
    future: asyncio.Future[CallResult]
    deadline: float
    seq: int


@dataclass
class _Topic:
    heads: list[QueuedItem] = field(default_factory=list)
    items: int = 0
    units: int = 0
    turn: TopicTurn = field(default_factory=TopicTurn)
    paused_until: float = 0.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, maximum=MAX_BACKOFF_S))
    served: int = 0


@dataclass
class OutboundStats:
    messages: int = 0
    edits: int = 0
    files: int = 0
    pings: int = 0
    units_sent: int = 0  # UTF-16 units of output text that went out
    failed: int = 0


class OutboundScheduler:
    def __init__(self, term: LeaderTerm, gateway: TelegramGateway, options: OutboundOptions,
                 on_topic_gone: Callable[[int, int], Awaitable[object]] | None = None,
                 keyboards: Keyboards | None = None):
        self._term = term
        self._gateway = gateway
        self._keyboards = keyboards
        self._live_keyboards: dict[TopicKey, Keyboard] = {}  # the keyboard on each topic's live message
        self._repo = OutboxRepository(term.db)
        self.options = options
        self.budget = ChatBudget(options.budget)
        self._output = options.output
        self._on_topic_gone = on_topic_gone
        self._topics: dict[TopicKey, _Topic] = {}
        self._calls: deque[_Call] = deque()
        self._dirty: set[TopicKey] = set()
        self._rescan = True
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._served = itertools.count(1)
        self._arrived: dict[int, int] = {}  # outbox id -> when this scheduler first saw it (monotonic ms)
        self._seq = itertools.count()
        self.stats = OutboundStats()

    # --- life -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="outbound-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        while self._calls:
            call = self._calls.popleft()
            if not call.future.done():
                call.future.set_result(CallResult(Outcome.AMBIGUOUS, "leader stopping"))

    def wake(self, chat_id: int | None = None, thread_id: int | None = None) -> None:
        """The outbox changed (for one topic, or for any when no chat is given)."""
        if chat_id is None:
            self._rescan = True
        else:
            self._dirty.add((chat_id, thread_id))
        self._wake.set()

    # --- other calls --------------------------------------------------------------------------------
    async def call(self, priority: Priority, chat_id: int, thread_id: int | None,
                   fn: Callable[[], Awaitable[CallResult]], *, spends: bool = True,
                   deadline_s: float = CALL_DEADLINE_S) -> CallResult:
        """Run one Bot API call when the budget allows it. ``RetryAfter`` is retried (the call did not
        happen) until ``deadline_s``; a BACKGROUND call is skipped while the budget is under pressure."""
        future: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        self._calls.append(_Call(priority, (chat_id, thread_id), spends, fn, future,
                                 time.monotonic() + deadline_s, next(self._seq)))
        self._wake.set()
        return await future

    # --- views --------------------------------------------------------------------------------------
    def owner_spoke(self, chat_id: int, thread_id: int | None) -> None:
        """An owner's message in this topic: see :meth:`TopicTurn.owner_spoke` (in memory, instant)."""
        topic = self._topics.get((chat_id, thread_id))
        if topic is not None:
            topic.turn.owner_spoke()
            self.wake(chat_id, thread_id)

    def backlog(self) -> dict[TopicKey, tuple[int, int]]:
        """(items, UTF-16 units) waiting per topic, as last read."""
        return {key: (t.items, t.units) for key, t in self._topics.items() if t.items}

    @property
    def sent(self) -> int:
        return self.stats.messages + self.stats.files + self.stats.pings

    @property
    def retry_after_hits(self) -> int:
        return self.budget.retry_after_hits

    def budget_used(self) -> int:
        return self.budget.used(time.monotonic())

    def metrics(self) -> dict[str, float]:
        """The budget, the backlog and the economy of output, for /metrics."""
        now = time.monotonic()
        stats = self.stats
        backlog = self.backlog().values()
        spent = stats.messages + stats.edits + stats.files + stats.pings
        return {"topicbus_budget_used": self.budget.used(now),
                "topicbus_budget_per_minute": self.budget.config.per_minute or 0,
                "topicbus_budget_paused_seconds": max(0.0, self.budget.paused_until - now),
                "topicbus_outbox_backlog_items": sum(items for items, _ in backlog),
                "topicbus_outbox_backlog_chars": sum(units for _, units in backlog),
                "topicbus_outbound_edits_total": stats.edits, "topicbus_outbound_files_total": stats.files,
                "topicbus_output_chars_total": stats.units_sent,
                "topicbus_messages_per_kb": spent / (stats.units_sent / 1000) if stats.units_sent else 0.0}

    def budget_view(self) -> dict[str, Any]:
        """The chat's allowance for status: spent in the last window, the limits, any pause left."""
        now = time.monotonic()
        config = self.budget.config
        return {"usedLastMinute": self.budget.used(now), "perMinute": config.per_minute,
                "perSecond": config.per_second, "reserve": config.reserve,
                "pausedForS": round(max(0.0, self.budget.paused_until - now), 1),
                "retryAfterHits": self.budget.retry_after_hits}

    # --- the loop -------------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._refresh()
                now = time.monotonic()
                chosen, next_at = self._choose(now)
                if chosen is not None:
                    await self._execute(chosen, now)
                    continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the scheduler must outlive any one failure
                self._term.events.record(exc, phase="outbound-scheduler", level="ERROR")
                next_at = time.monotonic() + 1.0
            timeout = None if next_at == float("inf") else max(0.0, next_at - time.monotonic())
            try:
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives as the
                # event is set (gh-86296), and stop() would then wait for this task for ever.
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                continue
            await asyncio.sleep(WAKE_DEBOUNCE_S)  # let a burst of sends land before planning

    async def _refresh(self) -> None:
        if self._rescan:
            self._rescan = False
            backlog = {(b.chat_id, b.thread_id): b for b in await self._repo.topics()}
            for key in backlog.keys() | self._topics.keys():
                self._dirty.add(key)
        dirty, self._dirty = self._dirty, set()
        for key in dirty:
            topic = self._topics.setdefault(key, _Topic())
            topic.heads = self._stamped(await self._repo.heads(key[0], key[1], HEADS))
            if len(topic.heads) < HEADS:
                topic.items, topic.units = len(topic.heads), sum(i.units for i in topic.heads)
            else:
                topic.items, topic.units = await self._count(key)

    def _stamped(self, heads: list[QueuedItem]) -> list[QueuedItem]:
        """The heads with their arrival on this scheduler's clock (a burst is measured between outputs)."""
        now_ms = int(time.monotonic() * 1000)
        return [dataclasses.replace(i, arrived_ms=self._arrived.setdefault(i.id, now_ms)) for i in heads]

    async def _count(self, key: TopicKey) -> tuple[int, int]:
        for backlog in await self._repo.topics():
            if (backlog.chat_id, backlog.thread_id) == key:
                return backlog.items, backlog.units
        return 0, 0

    def _choose(self, now: float) -> tuple[Any, float]:
        best: tuple[tuple[int, int, int], Any] | None = None
        next_at = float("inf")
        pressure = self.budget.under_pressure(now)
        for call in list(self._calls):
            if call.priority is Priority.BACKGROUND and pressure:
                self._calls.remove(call)
                call.future.set_result(CallResult(Outcome.REJECTED, SKIPPED))
                continue
            ready = self.budget.ready_at(now, call.priority, spends=call.spends)
            if ready > now:
                next_at = min(next_at, ready)
                continue
            rank = (int(call.priority), self._topic_served(call.key), call.seq)
            if best is None or rank < best[0]:
                best = (rank, call)
        now_ms = int(now * 1000)
        for key, topic in self._topics.items():
            step = plan(topic.heads, topic.turn.stream, now_ms, self._output)
            if isinstance(step, Idle):
                continue
            if isinstance(step, Wait):
                next_at = min(next_at, step.until_ms / 1000)
                continue
            priority, spends = self._cost(step)
            ready = max(topic.paused_until, self.budget.ready_at(now, priority, spends=spends))
            if ready > now:
                next_at = min(next_at, ready)
                continue
            rank = (int(priority), topic.served, -1)
            if best is None or rank < best[0]:
                best = (rank, (key, topic, step))
        return (None if best is None else best[1]), next_at

    def _topic_served(self, key: TopicKey) -> int:
        topic = self._topics.get(key)
        return topic.served if topic is not None else 0

    @staticmethod
    def _cost(step: Any) -> tuple[Priority, bool]:
        if isinstance(step, Ping):
            return Priority.OUTPUT, True
        items = step.items if hasattr(step, "items") else (step.item,)
        priority = min(i.priority for i in items)
        spends = not (isinstance(step, Single) and step.item.kind == "chatAction")
        return priority, spends

    # --- doing it -----------------------------------------------------------------------------------
    async def _execute(self, chosen: Any, now: float) -> None:
        if isinstance(chosen, _Call):
            await self._execute_call(chosen, now)
            return
        key, topic, step = chosen
        topic.served = next(self._served)
        if isinstance(step, Ping):
            await self._ping(key, topic, now)
        elif isinstance(step, Single):
            await self._single(key, topic, step.item, now)
        elif isinstance(step, NewMessage):
            await self._new_message(key, topic, step, now)
        elif isinstance(step, Extend):
            await self._extend(key, topic, step, now)
        elif isinstance(step, AsFile):
            await self._as_file(key, topic, step, now)

    async def _execute_call(self, call: _Call, now: float) -> None:
        self._calls.remove(call)
        if call.key in self._topics:
            self._topics[call.key].served = next(self._served)
        try:
            result = await call.fn()
        except Exception as exc:  # noqa: BLE001 - a gateway never raises; this is a bug guard
            result = CallResult(Outcome.AMBIGUOUS, type(exc).__name__)
        finally:
            self.budget.record(time.monotonic(), spends=call.spends, priority=call.priority)
        if result.outcome is Outcome.RETRY_AFTER:
            self.budget.pause(time.monotonic(), result.retry_after_s)
            if time.monotonic() + result.retry_after_s < call.deadline:
                self._calls.appendleft(call)
                return
        if not call.future.done():
            call.future.set_result(result)

    async def _send(self, spends: bool, coro_fn: Callable[[], Awaitable[CallResult]],
                    priority: Priority = Priority.OUTPUT) -> CallResult:
        """One call; it is counted when its answer came (so the count never runs ahead of Telegram's)."""
        try:
            return await coro_fn()
        finally:
            self.budget.record(time.monotonic(), spends=spends, priority=priority)

    async def _single(self, key: TopicKey, topic: _Topic, item: QueuedItem, now: float) -> None:
        payload = (await self._repo.payloads([item.id])).get(item.id, {})
        chat, thread = key
        if item.kind == "chatAction":
            result = await self._send(False, lambda: self._gateway.send_chat_action(chat, thread, payload["action"]),
                                      item.priority)
        else:
            data = base64.b64decode(payload.get("dataBase64", ""), validate=False)
            caption = render(payload["caption"], None) if payload.get("caption") else None
            send = self._gateway.send_photo if item.kind == "photo" else self._gateway.send_document
            result = await self._send(True, lambda: send(chat, thread, payload.get("fileName", "file"), data, caption),
                                      item.priority)
            if result.outcome is Outcome.REJECTED and item.kind == "photo":
                # Telegram would not take it as a photo (size, dimensions): the same bytes as a file.
                result = await self._send(True, lambda: self._gateway.send_document(
                    chat, thread, payload.get("fileName", "file"), data, caption), item.priority)
        if await self._settle(key, topic, (item,), result):
            if item.kind != "chatAction":
                topic.turn.stream.live = None
                self.stats.messages += 1

    async def _texts(self, items: tuple[QueuedItem, ...]) -> tuple[str, dict[int, dict[str, Any]]]:
        payloads = await self._repo.payloads([i.id for i in items])
        return "\n".join(payloads.get(i.id, {}).get("text", "") for i in items), payloads

    async def _new_message(self, key: TopicKey, topic: _Topic, step: NewMessage, now: float) -> None:
        raw, payloads = await self._texts(step.items)
        head = step.items[0]
        buttons = payloads.get(head.id, {}).get("buttons") if head.has_buttons else None
        keyboard = await self._keyboard(key, head.id, step.items[-1].id, buttons, printing=not step.notify)
        markup = keys(keyboard) if keyboard is not None else None
        rendered = render(raw, head.fmt)
        parts = split(rendered) or [Rendered(raw or " ")]
        result = CallResult(Outcome.OK)
        message_id: int | None = None
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            result = await self._send_text(key, part, raw, silent=not step.notify or not last,
                                           markup=markup if last else None,
                                           priority=min(i.priority for i in step.items))
            if result.outcome is not Outcome.OK:
                break
            message_id = result.value if isinstance(result.value, int) else None
        if await self._settle(key, topic, step.items, result, message_id):
            growable = head.kind == "text" and not head.has_buttons and len(parts) == 1
            topic.turn.sent_message(int(time.monotonic() * 1000), notify=step.notify, message_id=message_id,
                                    fmt=head.fmt, raw=raw, units=utf16_len(raw), growable=growable,
                                    arrived_ms=max(i.arrived_ms for i in step.items))
            await self._carried(key, keyboard, message_id, live=growable)
            self.stats.messages += len(parts)
            if head.kind == "text":
                self.stats.units_sent += utf16_len(raw)

    async def _keyboard(self, key: TopicKey, head_id: int, last_id: int, buttons: Any, *,
                        printing: bool) -> Keyboard | None:
        """The keyboard a new message carries (``leader/keyboards``); None when there is none or it
        cannot be stored now (the output still goes out)."""
        if self._keyboards is None:
            return None
        try:
            return await self._keyboards.for_message(key[0], key[1], head_id=head_id, last_id=last_id,
                                                     buttons=buttons, printing=printing)
        except AuthorityLost:
            raise
        except Exception as exc:  # noqa: BLE001 - a keyboard is never worth holding output back
            self._term.events.record(exc, phase="outbound-keyboard", level="WARNING")
            return None

    async def _carried(self, key: TopicKey, keyboard: Keyboard | None, message_id: int | None, *,
                       live: bool) -> None:
        """A message went out with ``keyboard``: remember its message; the live message's keyboard is
        kept so that the edits that grow it keep (or drop) the Interrupt button."""
        if keyboard is not None and self._keyboards is not None:
            try:
                keyboard = await self._keyboards.sent(keyboard, message_id)
            except AuthorityLost:
                raise
            except Exception as exc:  # noqa: BLE001 - a press on it is then checked against the chat only
                self._term.events.record(exc, phase="outbound-keyboard", level="WARNING")
        if live and keyboard is not None:
            self._live_keyboards[key] = keyboard
        else:
            self._live_keyboards.pop(key, None)

    async def _send_text(self, key: TopicKey, message: Rendered, raw: str, *, silent: bool,
                         markup: Any = None, priority: Priority = Priority.OUTPUT) -> CallResult:
        chat, thread = key
        result = await self._send(True, lambda: self._gateway.send_message(chat, thread, message, silent=silent,
                                                                            buttons=markup), priority)
        if result.outcome is Outcome.REJECTED and message.parse_mode and "parse" in result.message.lower():
            # HTML Telegram cannot parse: the source as plain text, once.
            result = await self._send(True, lambda: self._gateway.send_message(chat, thread, as_plain(raw),
                                                                                silent=silent, buttons=markup),
                                      priority)
        return result

    async def _extend(self, key: TopicKey, topic: _Topic, step: Extend, now: float) -> None:
        live = topic.turn.stream.live
        assert live is not None
        added, _ = await self._texts(step.items)
        raw = f"{live.raw}\n{added}"
        rendered = render(raw, live.fmt)
        if rendered.length > self._output.max_message:
            topic.turn.stream.live = None  # no room after rendering: the next turn starts a new message
            return
        chat = key[0]
        keyboard = await self._growing_keyboard(key, live.message_id, step.items[-1].id)
        markup = keys(keyboard) if keyboard is not None else None
        result = await self._send(True, lambda: self._gateway.edit_message(chat, live.message_id, rendered,
                                                                            buttons=markup))
        if result.outcome is Outcome.REJECTED and "parse" not in result.message.lower():
            topic.turn.stream.live = None  # the message cannot be edited (deleted, too old): start anew
            self._live_keyboards.pop(key, None)
            return
        if await self._settle(key, topic, step.items, result, live.message_id):
            topic.turn.extended(int(time.monotonic() * 1000), raw, utf16_len(raw),
                                arrived_ms=max(i.arrived_ms for i in step.items))
            await self._carried(key, keyboard, live.message_id, live=True)
            self.stats.edits += 1
            self.stats.units_sent += utf16_len(added)

    async def _growing_keyboard(self, key: TopicKey, message_id: int, last_id: int) -> Keyboard | None:
        """The keyboard of the live message at an edit that grows it (the agent is printing): its
        Interrupt button while the registration that printed it is still registered, a new one for the
        newest output's process otherwise. Telegram drops a keyboard the edit does not repeat."""
        if self._keyboards is None:
            return None
        current = self._live_keyboards.get(key)
        if current is not None and current.message_id == message_id and self._keyboards.still_interruptible(current):
            return current
        return await self._keyboard(key, last_id, last_id, None, printing=True)

    async def _as_file(self, key: TopicKey, topic: _Topic, step: AsFile, now: float) -> None:
        items = step.items
        if len(items) == len(topic.heads) == HEADS:  # the run may go on beyond the heads read so far
            more = self._stamped(await self._repo.heads(key[0], key[1], FILE_HEADS))
            items = tuple(fitting(coalescible(more), self._output.max_file_units)) or items
        raw, _ = await self._texts(items)
        stamp = datetime.now(UTC).strftime("%H%M%S")
        preview = tail(raw, MAX_CAPTION - 2)
        caption = render(preview, "pre")
        chat, thread = key
        keyboard = await self._keyboard(key, items[0].id, items[-1].id, None, printing=True)
        markup = keys(keyboard) if keyboard is not None else None
        result = await self._send(True, lambda: self._gateway.send_document(
            chat, thread, f"output-{stamp}.txt", raw.encode("utf-8", "surrogatepass"), caption, silent=True,
            buttons=markup))
        message_id = result.value if isinstance(result.value, int) else None
        if await self._settle(key, topic, items, result, message_id):
            topic.turn.sent_message(int(time.monotonic() * 1000), notify=False, message_id=message_id,
                                    fmt=items[0].fmt, raw=raw, units=utf16_len(raw), growable=False,
                                    arrived_ms=max(i.arrived_ms for i in items))
            await self._carried(key, keyboard, message_id, live=False)
            self.stats.files += 1
            self.stats.units_sent += utf16_len(raw)

    async def _ping(self, key: TopicKey, topic: _Topic, now: float) -> None:
        text = topic.turn.ping_text()
        result = await self._send(True, lambda: self._gateway.send_message(key[0], key[1], Rendered(text)))
        if result.outcome is Outcome.RETRY_AFTER:
            self.budget.pause(time.monotonic(), result.retry_after_s)
            return
        topic.turn.pinged(int(time.monotonic() * 1000))  # a failed ping is not retried: it carries no output
        self._live_keyboards.pop(key, None)
        if result.ok:
            self.stats.pings += 1

    # --- outcomes -----------------------------------------------------------------------------------
    async def _settle(self, key: TopicKey, topic: _Topic, items: tuple[QueuedItem, ...], result: CallResult,
                      message_id: int | None = None) -> bool:
        """Record a call's outcome for the rows it covered; True when they went out."""
        authority = self._term.authority()
        ids = [i.id for i in items]
        if result.ok:
            await self._repo.mark_sent(ids, self._term.now_ms(), message_id, authority)
            for item_id in ids:
                self._arrived.pop(item_id, None)
            topic.backoff.reset()
            self.wake(*key)
            return True
        chat, thread = key
        if result.outcome is Outcome.RETRY_AFTER:
            self.budget.pause(time.monotonic(), result.retry_after_s)
            self._term.events.record("Telegram flood control; the chat is paused", phase="outbox-retry-after",
                                     level="WARNING", chatId=chat, threadId=thread, retryAfterS=result.retry_after_s)
            await self._repo.note_attempt(ids[0], f"retry-after {result.retry_after_s}s", authority)
        elif result.outcome is Outcome.AMBIGUOUS:
            topic.paused_until = time.monotonic() + topic.backoff.next()
            await self._repo.note_attempt(ids[0], f"ambiguous: {result.message}", authority)
        elif result.outcome is Outcome.GONE and thread is not None:
            topic.paused_until = time.monotonic() + GONE_PAUSE_S
            await self._repo.note_attempt(ids[0], "topic gone", authority)
            if self._on_topic_gone is not None:
                await self._on_topic_gone(chat, thread)
            if failed := await self._repo.fail_unbound(chat, thread, "topic gone", authority):
                self.stats.failed += failed
                self._term.events.record("Topic is gone; output no binding can take elsewhere dropped",
                                         phase="outbox-topic-gone", level="WARNING", chatId=chat, threadId=thread,
                                         items=failed)
                self.wake(*key)
        elif thread is not None and "topic_closed" in result.message.lower():
            await self._reopen(key, topic, ids[0])
        else:
            await self._repo.mark_failed(ids[0], f"{result.outcome}: {result.message}", authority)
            self._arrived.pop(ids[0], None)
            self.stats.failed += 1
            self._term.events.record("Telegram rejected output", phase="outbox-rejected", level="WARNING",
                                     chatId=chat, threadId=thread, error=result.message)
            self.wake(*key)
        return False

    async def _reopen(self, key: TopicKey, topic: _Topic, item_id: int) -> None:
        """A send into a closed topic: reopen it, then the same output is sent again (never dropped)."""
        chat, thread = key
        assert thread is not None
        self._term.events.record("Topic was closed; reopening it before sending", phase="topic-reopen",
                                 chatId=chat, threadId=thread)
        result = await self._send(True, lambda: self._gateway.reopen_topic(chat, thread), Priority.ANSWER)
        await self._repo.note_attempt(item_id, f"topic closed; reopen: {result.outcome}", self._term.authority())
        if not result.ok:
            topic.paused_until = time.monotonic() + topic.backoff.next()


class ScheduledGateway:
    """The gateway's topic and probe calls, each through the scheduler with its priority: topic
    creation for a waiting follower is an answer, cleanup goes with output, titles come last."""

    def __init__(self, gateway: TelegramGateway, scheduler: OutboundScheduler):
        self._gateway = gateway
        self._scheduler = scheduler

    async def create_topic(self, chat_id: int, name: str, icon_color: int | None = None) -> CallResult:
        return await self._scheduler.call(Priority.ANSWER, chat_id, None,
                                          lambda: self._gateway.create_topic(chat_id, name, icon_color))

    async def edit_topic(self, chat_id: int, thread_id: int, name: str) -> CallResult:
        return await self._scheduler.call(Priority.TITLE, chat_id, thread_id,
                                          lambda: self._gateway.edit_topic(chat_id, thread_id, name))

    async def close_topic(self, chat_id: int, thread_id: int) -> CallResult:
        return await self._scheduler.call(Priority.OUTPUT, chat_id, thread_id,
                                          lambda: self._gateway.close_topic(chat_id, thread_id))

    async def reopen_topic(self, chat_id: int, thread_id: int) -> CallResult:
        return await self._scheduler.call(Priority.ANSWER, chat_id, thread_id,
                                          lambda: self._gateway.reopen_topic(chat_id, thread_id))

    async def delete_topic(self, chat_id: int, thread_id: int) -> CallResult:
        return await self._scheduler.call(Priority.OUTPUT, chat_id, thread_id,
                                          lambda: self._gateway.delete_topic(chat_id, thread_id))

    async def send_chat_action(self, chat_id: int, thread_id: int | None, action: str) -> CallResult:
        return await self._scheduler.call(Priority.OUTPUT, chat_id, thread_id,
                                          lambda: self._gateway.send_chat_action(chat_id, thread_id, action),
                                          spends=False)

    async def answer_press(self, chat_id: int, thread_id: int | None, query_id: str, text: str, *,
                           alert: bool = False) -> CallResult:
        """Answer a button press: an answer to a person waiting, which spends none of the group's
        allowance (SPEC §9.1) but honours a RetryAfter pause; given up after a few seconds, when
        Telegram no longer takes it."""
        return await self._scheduler.call(Priority.ANSWER, chat_id, thread_id,
                                          lambda: self._gateway.answer_callback_query(query_id, text, alert=alert),
                                          spends=False, deadline_s=ANSWER_DEADLINE_S)

    async def show_choice(self, chat_id: int, thread_id: int | None, message_id: int,
                          message: Rendered | None) -> CallResult:
        """Edit a message whose button was pressed: its text with the choice under it (``message``),
        and no keyboard; with None, only the keyboard is removed. An edit: it spends the allowance."""
        if message is None:
            return await self._scheduler.call(Priority.ANSWER, chat_id, thread_id,
                                              lambda: self._gateway.edit_buttons(chat_id, message_id, None))
        return await self._scheduler.call(Priority.ANSWER, chat_id, thread_id,
                                          lambda: self._gateway.edit_message(chat_id, message_id, message))

    async def set_message_reaction(self, chat_id: int, message_id: int, emoji: str) -> CallResult:
        """The receipt reaction: the least important call, skipped while output is held back."""
        return await self._scheduler.call(Priority.BACKGROUND, chat_id, None,
                                          lambda: self._gateway.set_message_reaction(chat_id, message_id, emoji),
                                          spends=False)

    async def download(self, file_id: str) -> CallResult:
        return await self._gateway.download(file_id)  # not a send: no budget
