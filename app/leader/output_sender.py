"""One planned step of a topic's output, sent: what a step of :func:`topicbus.core.output.plan` becomes in
Bot API calls (a coalesced message, an edit that grows the live message, a file, a ping, a photo or a
document), the keyboard it carries (``leader/keyboards``), and how the outcome settles the outbox rows it
covers.

:class:`~topicbus.leader.outbound.OutboundScheduler` decides *when* and *which* topic; this module does
the step it chose, as a task of its own (one per topic at most). Every call here waits on the term's
wire (``leader/wire``) until the scheduler lets it go: one call on the wire at a time, checked against
the chat's budget when it goes, counted when its answer came, and a ``RetryAfter`` pauses the chat
before any other call goes. The sender never calls the scheduler back: once a step ended, the
scheduler reads that topic's outbox again.

Inline keyboards: a follower's buttons go under its message; while an agent prints, its silent stream
messages, its live message (at each edit) and its output files carry the Interrupt button. Both ride on
calls that go out anyway. The one call made for a keyboard alone takes an Interrupt button off a
message that is no longer the stream's latest, or off the last one once the stream ended
(:class:`~topicbus.core.output.Unbutton`, the lowest priority; an edit that grows the live message
without it removes it for free). :class:`CarriedKeyboards` knows which keyboard each topic's live
and screen message carries.

Durability: the rows one Telegram message covers are marked sent in one transaction after Telegram
accepted it; a crash in between repeats at most that one message per topic. A row Telegram refused for
good is marked failed; a closed topic is reopened and the same output sent again; a topic that is gone
fails only the rows no binding can carry elsewhere.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from topicbus.ports.store import Store
from topicbus.core.clock import Clock
from topicbus.logsetup import EventJournal
from topicbus.core.telegram import CallOutcome, CallResult
from topicbus.ports.telegram import Telegram
from topicbus.core.budget import Priority
from topicbus.core.target import Target
from topicbus.core.formatting import MAX_CAPTION, Rendered, as_plain, render, split, tail, utf16_len
from topicbus.core.output import (AsFile, EditScreen, Extend, LiveMessage, NewMessage, NewScreen, OutputConfig, Ping,
                                  QueuedItem, Single, TopicTurn, Unbutton, coalescible, fitting, prompt_only)
from topicbus.core.records import (Button, ChatActionMessage, DocumentMessage, Notice, OutboxItem, PhotoMessage,
                                   TextMessage)
from topicbus.leader.keyboards import Keyboards, keys
from topicbus.leader.term import LeaderTerm
from topicbus.leader.wire import TelegramWire
from topicbus.retry import Backoff
from topicbus.core.authority import AuthorityLost
from topicbus.core.keyboards import INTERRUPT, Keyboard

HEADS = 256  # the rows of a topic read for planning
FILE_HEADS = 8192  # the rows read when a run goes out as a file (it may reach beyond the heads)
MAX_BACKOFF_S = 30.0
GONE_PAUSE_S = 30.0
Step = Single | NewMessage | Extend | AsFile | NewScreen | EditScreen | Ping | Unbutton


@dataclass
class TopicOutput:
    """One topic's output as the scheduler sees it: the heads of its outbox, its size, its turn (the live
    message, what is owed), a pause after a failure, and when it was last served (for fairness)."""

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
    unbuttoned: int = 0  # edits that only took an Interrupt button off
    units_sent: int = 0  # UTF-16 units of output text that went out
    failed: int = 0


class OutputSender:
    def __init__(self, term: LeaderTerm, gateway: Telegram, wire: TelegramWire, output: OutputConfig, *,
                 on_topic_gone: Callable[[Target], Awaitable[object]] | None = None,
                 keyboards: Keyboards | None = None, store: Store, clock: Clock, events: EventJournal):
        self._term = term
        self._clock = clock
        self._events = events
        self._gateway = gateway
        self._wire = wire
        self._output = output
        self._on_topic_gone = on_topic_gone
        self._keyboards = CarriedKeyboards(keyboards, events)
        self._repo = store.outbox
        self._arrived: dict[int, int] = {}  # outbox id -> when this term first saw it (monotonic ms)
        self.stats = OutboundStats()

    def stamped(self, heads: list[QueuedItem]) -> list[QueuedItem]:
        """The heads with their arrival on this term's clock (a burst is measured between outputs)."""
        now_ms = int(time.monotonic() * 1000)
        return [dataclasses.replace(i, arrived_ms=self._arrived.setdefault(i.id, now_ms)) for i in heads]

    async def execute(self, key: Target, topic: TopicOutput, step: Step, now: float) -> None:
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
        elif isinstance(step, NewScreen | EditScreen):
            await self._screen_frame(key, topic, step)
        elif isinstance(step, Unbutton):
            await self._unbutton(key, topic, step)

    async def _send(self, key: Target, spends: bool, coro_fn: Callable[[], Awaitable[CallResult]],
                    priority: Priority = Priority.OUTPUT) -> CallResult:
        """One call, on the wire in its turn; it is counted when its answer came (so the count never
        runs ahead of Telegram's), and a RetryAfter has paused the chat by the time it returns."""
        return await self._wire.output_call(priority, key, spends, coro_fn)

    async def _single(self, key: Target, topic: TopicOutput, item: QueuedItem, now: float) -> None:
        payload = (await self._repo.payloads([item.id])).get(item.id)
        if isinstance(payload, ChatActionMessage):
            action = payload.action
            result = await self._send(key, False, lambda: self._gateway.send_chat_action(key, action),
                                      item.priority)
        elif isinstance(payload, DocumentMessage | PhotoMessage):
            file = payload
            caption = render(file.caption, None) if file.caption else None
            send = self._gateway.send_photo if isinstance(file, PhotoMessage) else self._gateway.send_document
            result = await self._send(key, True, lambda: send(key, file.file_name, file.data, caption),
                                      item.priority)
            if result.outcome is CallOutcome.REJECTED and isinstance(file, PhotoMessage):
                # Telegram would not take it as a photo (size, dimensions): the same bytes as a file.
                result = await self._send(key, True, lambda: self._gateway.send_document(
                    key, file.file_name, file.data, caption), item.priority)
        else:  # gone meanwhile, or a kind this version cannot send (a newer leader stored it)
            result = CallResult(CallOutcome.REJECTED, message=f"no {item.kind} payload to send")
        if await self._settle(key, topic, (item,), result):
            if not isinstance(payload, ChatActionMessage):
                topic.turn.stream.live = None
                topic.turn.stream.screen = None
                self.stats.messages += 1

    async def _texts(self, items: tuple[QueuedItem, ...]) -> tuple[str, dict[int, OutboxItem]]:
        payloads = await self._repo.payloads([i.id for i in items])
        return "\n".join(_shown_texts(items, payloads)), payloads

    async def _new_message(self, key: Target, topic: TopicOutput, step: NewMessage, now: float) -> None:
        owner_turns = topic.turn.stream.owner_turns
        raw, payloads = await self._texts(step.items)
        head = step.items[0]
        live = topic.turn.stream.live
        if (len(step.items) == 1 and head.kind == "text" and not head.has_buttons and live is not None
                and live.fmt == head.fmt and prompt_only(raw)
                and live.units + 1 + utf16_len(raw) <= self._output.max_message):
            # A prompt alone, and the topic's latest message is the live one: it joins that message.
            await self._extend(key, topic, Extend(step.items), now)
            return
        buttons = _buttons(payloads.get(head.id)) if head.has_buttons else ()
        keyboard = await self._keyboards.for_message(key, head.id, step.items[-1].id, buttons, printing=not step.notify)
        markup = keys(keyboard) if keyboard is not None else None
        rendered = render(raw, head.fmt)
        parts = split(rendered) or [Rendered(raw or " ")]
        result = CallResult(CallOutcome.OK)
        message_id: int | None = None
        # A leader notice may answer one message (a voice note's transcript); a notice goes alone.
        notice = payloads.get(head.id)
        reply_to = notice.reply_to if isinstance(notice, Notice) else None
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            result = await self._send_text(key, part, raw, silent=not step.notify or not last,
                                           markup=markup if last else None,
                                           priority=min(i.priority for i in step.items),
                                           reply_to=reply_to if index == 0 else None)
            if result.outcome is not CallOutcome.OK:
                break
            message_id = result.value if isinstance(result.value, int) else None
        if await self._settle(key, topic, step.items, result, message_id):
            growable = head.kind == "text" and not head.has_buttons and len(parts) == 1
            topic.turn.sent_message(int(time.monotonic() * 1000), notify=step.notify, message_id=message_id,
                                    fmt=head.fmt, raw=raw, units=utf16_len(raw), growable=growable,
                                    arrived_ms=max(i.arrived_ms for i in step.items), owner_turns=owner_turns)
            _keep_tail(topic, step.items, payloads)
            await self._keyboards.carried(key, keyboard, message_id, live=topic.turn.stream.live is not None)
            topic.turn.carried_button(message_id, _interrupts(keyboard))
            self.stats.messages += len(parts)
            if head.kind == "text":
                self.stats.units_sent += utf16_len(raw)

    async def _send_text(self, key: Target, message: Rendered, raw: str, *, silent: bool,
                         markup: Any = None, priority: Priority = Priority.OUTPUT,
                         reply_to: int | None = None) -> CallResult:
        result = await self._send(key, True, lambda: self._gateway.send_message(key, message, silent=silent,
                                                                            buttons=markup, reply_to=reply_to),
                                  priority)
        if result.outcome is CallOutcome.REJECTED and message.parse_mode and "parse" in result.message.lower():
            # HTML Telegram cannot parse: the source as plain text, once.
            result = await self._send(key, True, lambda: self._gateway.send_message(key, as_plain(raw),
                                                                                silent=silent, buttons=markup,
                                                                                reply_to=reply_to),
                                      priority)
        return result

    async def _extend(self, key: Target, topic: TopicOutput, step: Extend, now: float) -> None:
        live = topic.turn.stream.live
        assert live is not None
        owner_turns = topic.turn.stream.owner_turns
        added, payloads = await self._texts(step.items)
        # The stream stops at a prompt: its last edit, without the button (a tail, a line still being
        # redrawn, is never one).
        prompt = not _is_tail(payloads.get(step.items[-1].id)) and prompt_only(added)
        shown = _without_tail(live)  # empty when the message held only a tail: the line replaces it
        raw = f"{shown}\n{added}" if shown else added
        rendered = render(raw, live.fmt)
        if rendered.length > self._output.max_message:
            topic.turn.stream.live = None  # no room after rendering: the next turn starts a new message
            return
        chat = key.chat_id
        keyboard = None if prompt else await self._keyboards.growing(key, live.message_id, step.items[-1].id)
        markup = keys(keyboard) if keyboard is not None else None
        result = await self._send(key, True, lambda: self._gateway.edit_message(chat, live.message_id, rendered,
                                                                            buttons=markup))
        if result.outcome is CallOutcome.REJECTED:
            # The message cannot be edited (deleted, too old), or the joined text does not parse (HTML):
            # the items go out in a new message instead, which falls back to plain text if need be.
            topic.turn.stream.live = None
            self._keyboards.drop_live(key)
            return
        if await self._settle(key, topic, step.items, result, live.message_id):
            topic.turn.extended(int(time.monotonic() * 1000), raw, utf16_len(raw),
                                arrived_ms=max(i.arrived_ms for i in step.items), owner_turns=owner_turns,
                                prompt=prompt)
            _keep_tail(topic, step.items, payloads)
            await self._keyboards.carried(key, keyboard, live.message_id, live=topic.turn.stream.live is not None)
            topic.turn.carried_button(live.message_id, _interrupts(keyboard))  # an edit without it took it off
            self.stats.edits += 1
            self.stats.units_sent += utf16_len(added)

    async def _screen_frame(self, key: Target, topic: TopicOutput, step: NewScreen | EditScreen) -> None:
        """The newest pending frame of a full-screen program: a new screen message, or the screen message
        edited in place. The frames passed over are settled with it (they were never shown); a frame equal
        to what the message shows already costs no call. The message carries the Interrupt button."""
        newest = step.items[-1]
        raw = _text((await self._repo.payloads([newest.id])).get(newest.id)) or " "
        rendered = (split(render(raw, newest.fmt)) or [Rendered(raw)])[0]  # a screen taller than a message: its top
        chat = key.chat_id
        now_ms = int(time.monotonic() * 1000)
        screen = topic.turn.stream.screen
        if isinstance(step, EditScreen) and screen is not None:
            if raw == screen.raw:
                result = CallResult(CallOutcome.OK)
            else:
                keyboard = await self._keyboards.growing(key, screen.message_id, newest.id, screen=True)
                markup = keys(keyboard) if keyboard is not None else None
                result = await self._send(key, True, lambda: self._gateway.edit_message(chat, screen.message_id,
                                                                                    rendered, buttons=markup))
                if result.outcome is CallOutcome.REJECTED:
                    topic.turn.stream.screen = None  # deleted, too old: the next turn starts a new screen message
                    self._keyboards.drop_screen(key)
                    return
                if result.ok:
                    await self._keyboards.screen_carried(key, keyboard, screen.message_id)
                    self.stats.edits += 1
            if await self._settle(key, topic, step.items, result, screen.message_id):
                topic.turn.screen_edited(now_ms, raw, newest.arrived_ms)
            return
        notify = isinstance(step, NewScreen) and step.notify
        keyboard = await self._keyboards.for_message(key, step.items[0].id, newest.id, (), printing=True)
        markup = keys(keyboard) if keyboard is not None else None
        result = await self._send(key, True, lambda: self._gateway.send_message(key, rendered, silent=not notify,
                                                                            buttons=markup))
        message_id = result.value if isinstance(result.value, int) else None
        if await self._settle(key, topic, step.items, result, message_id):
            topic.turn.screen_sent(now_ms, notify=notify, message_id=message_id, raw=raw,
                                   arrived_ms=newest.arrived_ms)
            self._keyboards.drop_live(key)
            await self._keyboards.screen_carried(key, keyboard, message_id)
            self.stats.messages += 1
            self.stats.units_sent += utf16_len(raw)

    async def _as_file(self, key: Target, topic: TopicOutput, step: AsFile, now: float) -> None:
        items = step.items
        if len(items) == len(topic.heads) == HEADS:  # the run may go on beyond the heads read so far
            more = self.stamped(await self._repo.heads(key, FILE_HEADS))
            items = tuple(fitting(coalescible(more), self._output.max_file_units)) or items
        raw, _ = await self._texts(items)
        stamp = datetime.now(UTC).strftime("%H%M%S")
        preview = tail(raw, MAX_CAPTION - 2)
        caption = render(preview, "pre")
        keyboard = await self._keyboards.for_message(key, items[0].id, items[-1].id, (), printing=True)
        markup = keys(keyboard) if keyboard is not None else None
        result = await self._send(key, True, lambda: self._gateway.send_document(
            key, f"output-{stamp}.txt", raw.encode("utf-8", "surrogatepass"), caption, silent=True,
            buttons=markup))
        message_id = result.value if isinstance(result.value, int) else None
        if await self._settle(key, topic, items, result, message_id):
            topic.turn.sent_message(int(time.monotonic() * 1000), notify=False, message_id=message_id,
                                    fmt=items[0].fmt, raw=raw, units=utf16_len(raw), growable=False,
                                    arrived_ms=max(i.arrived_ms for i in items))
            await self._keyboards.carried(key, keyboard, message_id, live=False)
            topic.turn.carried_button(message_id, _interrupts(keyboard))
            self.stats.files += 1
            self.stats.units_sent += utf16_len(raw)

    async def _ping(self, key: Target, topic: TopicOutput, now: float) -> None:
        text = topic.turn.ping_text()
        result = await self._send(key, True, lambda: self._gateway.send_message(key, Rendered(text)))
        if result.outcome is CallOutcome.RETRY_AFTER:
            return  # the chat is paused already (the wire); the ping is owed still
        topic.turn.pinged(int(time.monotonic() * 1000))  # a failed ping is not retried: it carries no output
        self._keyboards.drop_live(key)
        if result.ok:
            self.stats.pings += 1

    async def _unbutton(self, key: Target, topic: TopicOutput, step: Unbutton) -> None:
        """Take the Interrupt button off a message that is no longer the end of a running stream. Any
        answer but a RetryAfter settles it: a message gone or already without buttons is not retried."""
        result = await self._send(key, True, lambda: self._gateway.edit_buttons(key.chat_id, step.message_id, None),
                                  Priority.BACKGROUND)
        if result.outcome is CallOutcome.RETRY_AFTER:
            return
        topic.turn.carried_button(step.message_id, False)
        self._keyboards.unbuttoned(key, step.message_id)
        if result.ok:
            self.stats.unbuttoned += 1

    # --- outcomes -----------------------------------------------------------------------------------
    async def _settle(self, key: Target, topic: TopicOutput, items: tuple[QueuedItem, ...], result: CallResult,
                      message_id: int | None = None) -> bool:
        """Record a call's outcome for the rows it covered; True when they went out."""
        authority = self._term.authority()
        ids = [i.id for i in items]
        if result.ok:
            await self._repo.mark_sent(ids, self._clock.now_ms(), message_id, authority)
            for item_id in ids:
                self._arrived.pop(item_id, None)
            topic.backoff.reset()
            return True
        chat, thread = key.chat_id, key.thread_id
        if result.outcome is CallOutcome.RETRY_AFTER:  # the chat is paused already (the wire)
            self._events.record("Telegram flood control; the chat is paused", phase="outbox-retry-after",
                                     level="WARNING", chatId=chat, threadId=thread, retryAfterS=result.retry_after_s)
            await self._repo.note_attempt(ids[0], f"retry-after {result.retry_after_s}s", authority)
        elif result.outcome is CallOutcome.AMBIGUOUS:
            topic.paused_until = time.monotonic() + topic.backoff.next()
            await self._repo.note_attempt(ids[0], f"ambiguous: {result.message}", authority)
        elif result.outcome is CallOutcome.GONE and thread is not None:
            topic.paused_until = time.monotonic() + GONE_PAUSE_S
            await self._repo.note_attempt(ids[0], "topic gone", authority)
            if self._on_topic_gone is not None:
                await self._on_topic_gone(key)
            if failed := await self._repo.fail_unbound(key, "topic gone", authority):
                self.stats.failed += failed
                self._events.record("Topic is gone; output no binding can take elsewhere dropped",
                                         phase="outbox-topic-gone", level="WARNING", chatId=chat, threadId=thread,
                                         items=failed)
        elif thread is not None and "topic_closed" in result.message.lower():
            await self._reopen(key, topic, ids[0])
        else:
            await self._repo.mark_failed(ids[0], f"{result.outcome}: {result.message}", authority)
            self._arrived.pop(ids[0], None)
            self.stats.failed += 1
            self._events.record("Telegram rejected output", phase="outbox-rejected", level="WARNING",
                                     chatId=chat, threadId=thread, error=result.message)
        return False

    async def _reopen(self, key: Target, topic: TopicOutput, item_id: int) -> None:
        """A send into a closed topic: reopen it, then the same output is sent again (never dropped)."""
        chat, thread = key.chat_id, key.thread_id
        assert thread is not None
        self._events.record("Topic was closed; reopening it before sending", phase="topic-reopen",
                                 chatId=chat, threadId=thread)
        result = await self._send(key, True, lambda: self._gateway.reopen_topic(key), Priority.ANSWER)
        await self._repo.note_attempt(item_id, f"topic closed; reopen: {result.outcome}", self._term.authority())
        if not result.ok:
            topic.paused_until = time.monotonic() + topic.backoff.next()


# --- what a payload says (None: the row is gone) --------------------------------------------------
def _text(payload: OutboxItem | None) -> str:
    return payload.text if isinstance(payload, TextMessage | Notice) else ""


def _buttons(payload: OutboxItem | None) -> tuple[tuple[Button, ...], ...]:
    return payload.buttons if isinstance(payload, TextMessage) else ()


class CarriedKeyboards:
    """The keyboard each output message carries (``leader/keyboards``: a follower's buttons, or the
    Interrupt button while an agent prints), and which one is on each topic's live message and screen
    message, so that the edits that grow them keep it (or take it off). A keyboard is never worth
    holding output back: one that cannot be stored is left out, the failure recorded."""

    def __init__(self, keyboards: Keyboards | None, events: EventJournal):
        self._events = events
        self._keyboards = keyboards
        self._live_keyboards: dict[Target, Keyboard] = {}  # the keyboard on each topic's live message
        self._screen_keyboards: dict[Target, Keyboard] = {}  # the keyboard on each topic's screen message

    async def for_message(self, key: Target, head_id: int, last_id: int, buttons: tuple[tuple[Button, ...], ...], *,
                          printing: bool) -> Keyboard | None:
        """The keyboard a new message carries (``leader/keyboards``); None when there is none or it
        cannot be stored now (the output still goes out)."""
        if self._keyboards is None:
            return None
        try:
            return await self._keyboards.for_message(key, head_id=head_id, last_id=last_id,
                                                     buttons=buttons, printing=printing)
        except AuthorityLost:
            raise
        except Exception as exc:  # noqa: BLE001 - a keyboard is never worth holding output back
            self._events.record(exc, phase="outbound-keyboard", level="WARNING")
            return None

    async def carried(self, key: Target, keyboard: Keyboard | None, message_id: int | None, *,
                      live: bool) -> None:
        """A message went out with ``keyboard``: remember its message; the live message's keyboard is
        kept so that the edits that grow it keep (or drop) the Interrupt button."""
        if keyboard is not None:
            keyboard = await self._sent(keyboard, message_id)
        if live and keyboard is not None:
            self._live_keyboards[key] = keyboard
        else:
            self._live_keyboards.pop(key, None)

    async def growing(self, key: Target, message_id: int, last_id: int, *,
                      screen: bool = False) -> Keyboard | None:
        """The keyboard of the live message (or, with ``screen``, the screen message) at an edit that
        grows it (the agent is printing): its Interrupt button while the registration that printed it
        is still registered, a new one for the newest output's process otherwise. Telegram drops a
        keyboard the edit does not repeat."""
        if self._keyboards is None:
            return None
        current = (self._screen_keyboards if screen else self._live_keyboards).get(key)
        if current is not None and current.message_id == message_id and self._keyboards.still_interruptible(current):
            return current
        return await self.for_message(key, last_id, last_id, (), printing=True)

    async def screen_carried(self, key: Target, keyboard: Keyboard | None, message_id: int | None) -> None:
        """A screen message went out (or was edited) with ``keyboard``: kept for its next edit."""
        if keyboard is None or self._keyboards is None:
            self._screen_keyboards.pop(key, None)
            return
        self._screen_keyboards[key] = await self._sent(keyboard, message_id)

    async def _sent(self, keyboard: Keyboard, message_id: int | None) -> Keyboard:
        """The keyboard with the message that carries it recorded; as it was when that cannot be
        stored now (a press on it is then checked against the chat only)."""
        if self._keyboards is None:
            return keyboard
        try:
            return await self._keyboards.sent(keyboard, message_id)
        except AuthorityLost:
            raise
        except Exception as exc:  # noqa: BLE001 - a keyboard is never worth holding output back
            self._events.record(exc, phase="outbound-keyboard", level="WARNING")
            return keyboard

    def drop_live(self, key: Target) -> None:
        """The topic's live message is no longer grown (or no longer carries a keyboard)."""
        self._live_keyboards.pop(key, None)

    def drop_screen(self, key: Target) -> None:
        self._screen_keyboards.pop(key, None)

    def unbuttoned(self, key: Target, message_id: int) -> None:
        """The Interrupt button was taken off ``message_id``: if it is the live message, a later edit
        of it asks for a new keyboard."""
        current = self._live_keyboards.get(key)
        if current is not None and current.message_id == message_id:
            self._live_keyboards.pop(key, None)


# --- tails (tail-v1): a line still being redrawn, replaced by what follows ----------------------------
def _is_tail(payload: OutboxItem | None) -> bool:
    return isinstance(payload, TextMessage) and payload.tail


def _shown_texts(items: Sequence[QueuedItem], payloads: dict[int, OutboxItem]) -> list[str]:
    """The texts of ``items`` as shown: a tail followed by anything is replaced by it (dropped)."""
    last = len(items) - 1
    return [_text(payloads.get(item.id)) for index, item in enumerate(items)
            if index == last or not _is_tail(payloads.get(item.id))]


def _keep_tail(topic: TopicOutput, items: Sequence[QueuedItem], payloads: dict[int, OutboxItem]) -> None:
    """After a send or an edit: the live message's last line is a tail when the last item was one."""
    live = topic.turn.stream.live
    if live is not None:
        payload = payloads.get(items[-1].id)
        live.tail = _text(payload) if _is_tail(payload) else ""


def _without_tail(live: LiveMessage) -> str:
    """The live message's text without its tail: what the next output is appended to."""
    if live.tail and live.raw.endswith(live.tail):
        return live.raw[: len(live.raw) - len(live.tail)].rstrip("\n")
    return live.raw


def _interrupts(keyboard: Keyboard | None) -> bool:
    return keyboard is not None and keyboard.kind == INTERRUPT
