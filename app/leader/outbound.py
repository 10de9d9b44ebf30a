"""The outbound scheduler: one spender of the chat's Telegram budget (docs/operations.md, "The outbound budget").

Every outbound Bot API call of a term goes through :class:`OutboundScheduler`:

* the durable outbox (agent output and the leader's notices), topic by topic, planned by
  :func:`topicbus.core.output.plan` — coalesced messages, growing live messages, files, pings — and
  sent by :class:`~topicbus.leader.output_sender.OutputSender`;
* other calls (topic create/edit/close/reopen/delete, probes, reactions, showing a button's choice) through
  :meth:`OutboundScheduler.call`, usually via :class:`ScheduledGateway`, which has the gateway's methods
  with a priority each.

It spends :class:`~topicbus.core.budget.ChatBudget` by priority (control answers and notices, then
answers to buttons and prompts, then output, then title edits), topics in turn (least recently
served first), and pauses the whole chat for what ``RetryAfter`` says. Order inside a topic never
changes. It replaces PTB's ``AIORateLimiter`` (docs/operations.md, "The outbound budget").

Answers to button presses (``answerCallbackQuery``) are not its calls: they have a bounded lane of
their own (``leader/press_answers``), whose calls a second are taken off the scheduler's share of the
bot's (:meth:`OutboundOptions.scheduler_budget`), so no storm of presses can delay output.

Telegram calls go out one at a time on the term's wire (``leader/wire``), each checked against the
budget here when it goes and counted there when its answer came. What surrounds an output call — reading the payloads, settling the rows in
SQLite, reading the topic's heads again — runs as a *step* of its own task, so up to
``STEPS_IN_FLIGHT`` topics (each at most one step, so order inside a topic holds) are prepared and
settled while another topic's call is on the wire. A step's calls wait for the wire with their
priority like every other call; a step begins only when the budget would allow its call even if
every step in progress had already spent when it began.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any

from topicbus.core.clock import Clock
from topicbus.ports.store import Store
from topicbus.logsetup import EventJournal
from topicbus.core.telegram import CallOutcome, CallResult
from topicbus.ports.telegram import Telegram
from topicbus.core.budget import BudgetConfig, ChatBudget, Priority
from topicbus.core.formatting import Rendered
from topicbus.core.output import EditScreen, Idle, OutputConfig, Ping, Single, Unbutton, Wait, plan
from topicbus.core.press_answers import PressAnswerConfig, scheduler_share
from topicbus.core.records import ChatActionMessage
from topicbus.core.status import BudgetStatus
from topicbus.core.target import Target
from topicbus.leader.keyboards import Keyboards
from topicbus.leader.output_sender import HEADS, OutputSender, Step, TopicOutput
from topicbus.leader.term import LeaderTerm
from topicbus.leader.wire import CALL_DEADLINE_S, TelegramWire, WireCall

WAKE_DEBOUNCE_S = 0.02
STEPS_IN_FLIGHT = 4  # topics with a step in progress at once (each topic at most one)
PRESSURE_RECHECK_S = 1.0  # an Unbutton step skipped under pressure is looked at again this soon
SKIPPED = "skipped under pressure"


@dataclass(frozen=True)
class OutboundOptions:
    """The chat's budget, how output is shaped, and each follower's outbox cap."""

    budget: BudgetConfig = BudgetConfig()
    output: OutputConfig = OutputConfig()
    max_items: int = 1000
    max_bytes: int = 16 * 1024 * 1024

    @property
    def press_answers(self) -> PressAnswerConfig:
        """The press-answer lane's share of the bot's calls a second (``leader/press_answers``)."""
        return PressAnswerConfig.within(self.budget.overall_per_second)

    def scheduler_budget(self) -> BudgetConfig:
        """The chat's budget as the scheduler spends it: the bot's calls a second less the lane's."""
        return replace(self.budget, overall_per_second=scheduler_share(self.budget.overall_per_second,
                                                                       self.press_answers))


@dataclass(frozen=True)
class OutboundFigures:
    """The scheduler's figures at one moment: the budget spent in the last window, the chat's allowance
    a minute and any pause left, what waits (items, UTF-16 units), and this term's edits, files, units
    sent and Telegram messages per 1,000 units of output."""

    budget_used: int
    budget_per_minute: int
    budget_paused_s: float
    backlog_items: int
    backlog_units: int
    edits: int
    files: int
    units_sent: int
    messages_per_kb: float


class OutboundScheduler:
    def __init__(self, term: LeaderTerm, gateway: Telegram, options: OutboundOptions,
                 on_topic_gone: Callable[[Target], Awaitable[object]] | None = None,
                 keyboards: Keyboards | None = None, *, store: Store, clock: Clock, events: EventJournal):
        self._events = events
        self._repo = store.outbox
        self.options = options
        self.budget = ChatBudget(options.scheduler_budget())
        self._output = options.output
        self._wake = asyncio.Event()
        self._call_waiting = asyncio.Event()  # ends the output debounce: a call never waits for it
        # The one call on the wire and the calls waiting for it; the output steps put theirs there too.
        self._wire = TelegramWire(self.budget, self._wake, self._call_waiting)
        self._sender = OutputSender(term, gateway, self._wire, options.output, on_topic_gone=on_topic_gone,
                                    keyboards=keyboards, store=store, clock=clock, events=events)
        self.stats = self._sender.stats
        self._topics: dict[Target, TopicOutput] = {}
        self._dirty: set[Target] = set()
        self._rescan = True
        self._task: asyncio.Task[None] | None = None
        self._steps: dict[Target, asyncio.Task[None]] = {}  # the steps in progress, one per topic at most
        self._spending_since: dict[Target, float] = {}  # when each spending step in progress began
        self._hurry = False  # a step ended (or, the wire's ``answered``, a call): plan again without the debounce
        self._served = itertools.count(1)

    # --- life -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="outbound-scheduler")

    async def stop(self) -> None:
        """The term ends: nothing is planned any more; calls still waiting (and any made later) are
        answered as ambiguous at once."""
        tasks = [t for t in (self._task, *self._steps.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        self._steps.clear()
        self._spending_since.clear()
        await self._wire.close()

    def wake(self, topic: Target | None = None) -> None:
        """The outbox changed (for one topic, or for any when no topic is given)."""
        if topic is None:
            self._rescan = True
        else:
            self._dirty.add(topic)
        self._wake.set()

    # --- other calls --------------------------------------------------------------------------------
    async def call(self, priority: Priority, target: Target,
                   fn: Callable[[], Awaitable[CallResult]], *, spends: bool = True,
                   deadline_s: float = CALL_DEADLINE_S) -> CallResult:
        """Run one Bot API call when the budget allows it. ``RetryAfter`` is retried (the call did not
        happen) until ``deadline_s``; a BACKGROUND call is skipped while the budget is under pressure."""
        return await self._wire.call(priority, target, fn, spends=spends, deadline_s=deadline_s)

    # --- views --------------------------------------------------------------------------------------
    def owner_spoke(self, target: Target) -> None:
        """An owner's message in this topic: see :meth:`TopicTurn.owner_spoke` (in memory, instant)."""
        topic = self._topics.get(target)
        if topic is not None:
            topic.turn.owner_spoke()
            self._wake.set()  # plan again; the outbox did not change, so nothing is read again

    def stream_ends(self, target: Target) -> None:
        """The topic's follower left gracefully: see :meth:`TopicTurn.follower_left`."""
        self._topics.setdefault(target, TopicOutput()).turn.follower_left()
        self.wake(target)

    def backlog(self) -> dict[Target, tuple[int, int]]:
        """(items, UTF-16 units) waiting per topic, as last read."""
        return {key: (t.items, t.units) for key, t in self._topics.items() if t.items}

    @property
    def sent(self) -> int:
        return self.stats.messages + self.stats.files + self.stats.pings

    @property
    def retry_after_hits(self) -> int:
        return self.budget.retry_after_hits

    def figures(self) -> OutboundFigures:
        """The budget, the backlog and the economy of output, now (the composition root names them
        for /metrics)."""
        now = time.monotonic()
        stats = self.stats
        backlog = self.backlog().values()
        spent = stats.messages + stats.edits + stats.files + stats.pings + stats.unbuttoned
        return OutboundFigures(budget_used=self.budget.used(now), budget_per_minute=int(self.budget.config.per_minute or 0),
                               budget_paused_s=max(0.0, self.budget.paused_until - now),
                               backlog_items=sum(items for items, _ in backlog),
                               backlog_units=sum(units for _, units in backlog), edits=stats.edits,
                               files=stats.files, units_sent=stats.units_sent,
                               messages_per_kb=spent / (stats.units_sent / 1000) if stats.units_sent else 0.0)

    def budget_view(self) -> BudgetStatus:
        """The chat's allowance for status: spent in the last window, the limits, any pause left."""
        now = time.monotonic()
        config = self.budget.config
        return BudgetStatus(used_last_minute=self.budget.used(now), per_minute=config.per_minute,
                            per_second=config.per_second, reserve=config.reserve,
                            paused_for_s=round(max(0.0, self.budget.paused_until - now), 1),
                            retry_after_hits=self.budget.retry_after_hits)

    # --- the loop -------------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._refresh()
                now = time.monotonic()
                chosen, next_at = self._choose(now)
                if chosen is not None:
                    self._dispatch(chosen, now)
                    continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the scheduler must outlive any one failure
                self._events.record(exc, phase="outbound-scheduler", level="ERROR")
                next_at = time.monotonic() + 1.0
            timeout = None if next_at == float("inf") else max(0.0, next_at - time.monotonic())
            try:
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives as the
                # event is set (gh-86296), and stop() would then wait for this task for ever.
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                continue
            # A call (a topic to create, a choice to show) goes at once, and so does the next step once
            # one ended or while steps are in progress; new output alone: let a burst of sends land first.
            if not (self._wire.waiting or self._hurry or self._wire.answered or self._steps or self._wire.busy):
                await self._debounce()
            self._hurry = self._wire.answered = False

    async def _debounce(self) -> None:
        """Output: let a burst of sends land before planning. A call (a topic to create or delete, a
        choice to show) goes at once, also when it arrives during this pause: it ends the pause."""
        self._call_waiting.clear()
        try:
            async with asyncio.timeout(WAKE_DEBOUNCE_S):
                await self._call_waiting.wait()
        except TimeoutError:
            pass

    async def _refresh(self) -> None:
        if self._rescan:
            self._rescan = False
            backlog = {Target(b.chat_id, b.thread_id): b for b in await self._repo.topics()}
            for key in backlog.keys() | self._topics.keys():
                self._dirty.add(key)
        # A topic with a step in progress is read once that step ended (it cannot be chosen before).
        dirty = {key for key in self._dirty if key not in self._steps}
        self._dirty -= dirty
        for key in dirty:
            topic = self._topics.setdefault(key, TopicOutput())
            topic.heads = self._sender.stamped(await self._repo.heads(key, HEADS))
            if len(topic.heads) < HEADS:
                topic.items, topic.units = len(topic.heads), sum(i.units for i in topic.heads)
            else:
                topic.items, topic.units = await self._count(key)

    async def _count(self, key: Target) -> tuple[int, int]:
        for backlog in await self._repo.topics():
            if Target(backlog.chat_id, backlog.thread_id) == key:
                return backlog.items, backlog.units
        return 0, 0

    def _choose(self, now: float) -> tuple[Any, float]:
        best: tuple[tuple[int, int, int], Any] | None = None
        next_at = float("inf")
        pressure = self.budget.under_pressure(now)
        for call in list(self._wire.waiting):
            if call.priority is Priority.BACKGROUND and pressure:
                self._wire.skip(call, CallResult(CallOutcome.REJECTED, SKIPPED))
                continue
            if self._wire.busy:
                continue  # one call on the wire at a time; the loop is woken when it ends
            ready = self.budget.ready_at(now, call.priority, spends=call.spends)
            if ready > now:
                next_at = min(next_at, ready)
                continue
            rank = (int(call.priority), self._topic_served(call.key), call.seq)
            if best is None or rank < best[0]:
                best = (rank, call)
        now_ms = int(now * 1000)
        full = len(self._steps) >= STEPS_IN_FLIGHT
        pending = tuple(self._spending_since.values())
        for key, topic in self._topics.items():
            if full or key in self._steps or key in self._dirty:
                continue  # a step in progress, or heads to read again first (its last step changed them)
            step = plan(topic.heads, topic.turn.stream, now_ms, self._output)
            if isinstance(step, Idle):
                continue
            if isinstance(step, Wait):
                next_at = min(next_at, step.until_ms / 1000)
                continue
            if isinstance(step, Unbutton) and pressure:  # tidying waits while output is held back
                next_at = min(next_at, now + PRESSURE_RECHECK_S)
                continue
            priority, spends = self._cost(step)
            # A screen's next frame can wait: it never takes the chat's last output sends from other topics.
            headroom = self._output.screen_headroom if isinstance(step, EditScreen) else 0
            ready = max(topic.paused_until, self.budget.ready_at(now, priority, spends=spends, pending=pending,
                                                                 headroom=headroom))
            if ready > now:
                next_at = min(next_at, ready)
                continue
            rank = (int(priority), topic.served, -1)
            if best is None or rank < best[0]:
                best = (rank, (key, topic, step))
        return (None if best is None else best[1]), next_at

    def _topic_served(self, key: Target) -> int:
        topic = self._topics.get(key)
        return topic.served if topic is not None else 0

    @staticmethod
    def _cost(step: Step) -> tuple[Priority, bool]:
        if isinstance(step, Ping):
            return Priority.OUTPUT, True
        if isinstance(step, Unbutton):  # tidying: after every other call of every topic
            return Priority.BACKGROUND, True
        items = step.items if hasattr(step, "items") else (step.item,)
        priority = min(i.priority for i in items)
        spends = not (isinstance(step, Single) and step.item.kind == ChatActionMessage.type)
        return priority, spends

    # --- doing it -----------------------------------------------------------------------------------
    def _dispatch(self, chosen: Any, now: float) -> None:
        if isinstance(chosen, WireCall):
            if not chosen.output and chosen.key in self._topics:
                self._topics[chosen.key].served = next(self._served)
            self._wire.send(chosen)
            return
        key, topic, step = chosen
        topic.served = next(self._served)
        if self._cost(step)[1]:
            self._spending_since[key] = now
        self._steps[key] = asyncio.create_task(self._step(key, topic, step, now), name="outbound-step")

    async def _step(self, key: Target, topic: TopicOutput, step: Step, now: float) -> None:
        try:
            await self._sender.execute(key, topic, step, now)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the scheduler must outlive any one failure
            self._events.record(exc, phase="outbound-scheduler", level="ERROR")
            topic.paused_until = max(topic.paused_until, time.monotonic() + 1.0)
        finally:
            self._steps.pop(key, None)
            self._spending_since.pop(key, None)
            self._dirty.add(key)  # read its heads again before its next step
            self._hurry = True
            self._wake.set()


class ScheduledGateway:
    """The gateway's topic and probe calls, each through the scheduler with its priority: topic
    creation for a waiting follower is an answer, cleanup goes with output, titles come last."""

    def __init__(self, gateway: Telegram, scheduler: OutboundScheduler):
        self._gateway = gateway
        self._scheduler = scheduler

    async def create_topic(self, chat_id: int, name: str, icon_color: int | None = None) -> CallResult:
        return await self._scheduler.call(Priority.ANSWER, Target(chat_id),
                                          lambda: self._gateway.create_topic(chat_id, name, icon_color))

    async def edit_topic(self, topic: Target, name: str) -> CallResult:
        return await self._scheduler.call(Priority.TITLE, topic, lambda: self._gateway.edit_topic(topic, name))

    async def close_topic(self, topic: Target) -> CallResult:
        return await self._scheduler.call(Priority.OUTPUT, topic, lambda: self._gateway.close_topic(topic))

    async def reopen_topic(self, topic: Target) -> CallResult:
        return await self._scheduler.call(Priority.ANSWER, topic, lambda: self._gateway.reopen_topic(topic))

    async def delete_topic(self, topic: Target) -> CallResult:
        return await self._scheduler.call(Priority.OUTPUT, topic, lambda: self._gateway.delete_topic(topic))

    async def send_chat_action(self, target: Target, action: str) -> CallResult:
        return await self._scheduler.call(Priority.OUTPUT, target,
                                          lambda: self._gateway.send_chat_action(target, action), spends=False)

    async def show_choice(self, target: Target, message_id: int, message: Rendered | None) -> CallResult:
        """Edit a message whose button was pressed: its text with the choice under it (``message``),
        and no keyboard; with None, only the keyboard is removed. An edit: it spends the allowance."""
        if message is None:
            return await self._scheduler.call(Priority.ANSWER, target,
                                              lambda: self._gateway.edit_buttons(target.chat_id, message_id, None))
        return await self._scheduler.call(Priority.ANSWER, target,
                                          lambda: self._gateway.edit_message(target.chat_id, message_id, message))

    async def set_message_reaction(self, chat_id: int, message_id: int, emoji: str) -> CallResult:
        """The receipt reaction: the least important call, skipped while output is held back."""
        return await self._scheduler.call(Priority.BACKGROUND, Target(chat_id),
                                          lambda: self._gateway.set_message_reaction(chat_id, message_id, emoji),
                                          spends=False)

    def open_download(self, file_id: str) -> AbstractAsyncContextManager[CallResult]:
        """A file's bytes as a stream (:meth:`Telegram.open_download`): not a send, no budget."""
        return self._gateway.open_download(file_id)
