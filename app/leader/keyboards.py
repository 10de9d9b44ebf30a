"""Inline keyboards under output messages (docs/architecture.md, "A button press"): which message carries which buttons.

Telegram's ``callback_data`` holds at most 64 bytes, while a follower's button data may be 1,024
characters. So every button carries ``k:<token>:<index>`` (:func:`callback_data`), and the keyboard
itself is kept in the store (``storage/keyboards``): whose output it is under, the follower process
and registration it belongs to, and the data. ``leader/buttons`` serves the presses.

Which keyboard a message carries (the outbound scheduler asks :meth:`Keyboards.for_message`):

* a follower's own buttons (``send_text(..., buttons=…)``): such a message goes alone and carries
  them. They win over the Interrupt button;
* otherwise, while an agent is printing, the **Interrupt** button: on a silent message of a stream,
  on the live message each time it grows by an edit, and on output sent as a file. Only if the
  process that printed it is registered now and takes controls (``control-v1``). A message that
  notifies (a whole answer that fits, the end of a stream) and the leader's notices carry none.

The Interrupt button costs nothing to add: it rides on a send or an edit that goes out anyway. Only a
running stream's latest message keeps it: an edit that grows the live message drops it once the process
is gone, and the outbound scheduler takes it off other messages, and off the last one once the stream
ended, at its lowest priority (``core/output.Unbutton``). A press on an older one reaches the agent only while the registration that printed it is the
live one; otherwise the presser gets an alert and nothing happens.
"""

from __future__ import annotations

import dataclasses
import re
from topicbus.core.records import Button
from topicbus.core.target import Target
from topicbus.ports.store import Store
from topicbus.core.clock import Clock
from topicbus.core.telegram import InlineKeys
from topicbus.core.registry import FollowerRecord, FollowerRegistry
from topicbus.leader.term import LeaderTerm
from topicbus.protocol import CAP_BUTTON, CAP_CONTROL
from topicbus.core.keyboards import CHOICE, INTERRUPT, Keyboard

INTERRUPT_LABEL = "✋ Interrupt"
INTERRUPT_DATA = "interrupt"
_CALLBACK = re.compile(r"k:([A-Za-z0-9_-]{8,32}):(\d{1,3})")


def callback_data(token: str, index: int) -> str:
    """What a button hands back to the bot (well under Telegram's 64 bytes)."""
    return f"k:{token}:{index}"


def parse_callback(data: str | None) -> tuple[str, int] | None:
    """(token, button index) of a press, or None for data that is not one of ours."""
    match = _CALLBACK.fullmatch(data or "")
    return None if match is None else (match.group(1), int(match.group(2)))


def keys(keyboard: Keyboard) -> InlineKeys:
    """The keyboard as the gateway sends it: rows of (label, callback data)."""
    index = iter(range(1_000))
    return tuple(tuple((button.text, callback_data(keyboard.token, next(index))) for button in row)
                 for row in keyboard.buttons)


class Keyboards:
    """Makes and remembers the keyboards the outbound scheduler puts under messages."""

    def __init__(self, term: LeaderTerm, registry: FollowerRegistry, *, store: Store, clock: Clock):
        self._term = term
        self._clock = clock
        self._registry = registry
        self.repo = store.keyboards
        self._outbox = store.outbox

    async def for_message(self, target: Target, *, head_id: int, last_id: int,
                          buttons: tuple[tuple[Button, ...], ...], printing: bool) -> Keyboard | None:
        """The keyboard of a new output message: the follower's ``buttons`` of its ``head_id`` row,
        else, when ``printing``, the Interrupt button of the process that printed ``last_id``."""
        if buttons:
            return await self._choice(target, head_id, buttons)
        if printing:
            return await self.interrupt(target, last_id)
        return None

    async def _choice(self, target: Target, outbox_id: int,
                      buttons: tuple[tuple[Button, ...], ...]) -> Keyboard | None:
        origin = await self._outbox.origin(outbox_id)
        if origin is None:
            return None
        binding_key, instance_id, _ = origin
        record = self._registry.get(instance_id)
        # A registered follower says whether it takes presses; one restored from the previous term (no
        # capabilities known) or gone already is asked again when a press comes.
        takes = CAP_BUTTON in record.capabilities if record is not None and record.capabilities else None
        return await self.repo.make(kind=CHOICE, outbox_id=outbox_id, binding_key=binding_key,
                                    instance_id=instance_id,
                                    generation=record.registration_generation if record is not None else "",
                                    takes_presses=takes, chat_id=target.chat_id, thread_id=target.thread_id,
                                    buttons=buttons, now_ms=self._clock.now_ms(), authority=self._term.authority())

    async def interrupt(self, target: Target, outbox_id: int) -> Keyboard | None:
        """The Interrupt button for output row ``outbox_id``, if the process that printed it is
        registered now and takes controls; else None."""
        origin = await self._outbox.origin(outbox_id)
        if origin is None or origin[2] != "text":
            return None
        record = self._interruptible(origin[0], origin[1])
        if record is None:
            return None
        return await self.repo.make(kind=INTERRUPT, outbox_id=outbox_id, binding_key=origin[0],
                                    instance_id=record.instance_id, generation=record.registration_generation,
                                    takes_presses=None, chat_id=target.chat_id, thread_id=target.thread_id,
                                    buttons=((Button(INTERRUPT_LABEL, INTERRUPT_DATA),),),
                                    now_ms=self._clock.now_ms(), authority=self._term.authority())

    def still_interruptible(self, keyboard: Keyboard) -> bool:
        """Whether the registration an Interrupt button belongs to is still the registered one."""
        record = self._interruptible(keyboard.binding_key, keyboard.instance_id)
        return record is not None and record.registration_generation == keyboard.registration_generation

    def _interruptible(self, binding_key: str, instance_id: str) -> FollowerRecord | None:
        record = self._registry.get(instance_id)
        if record is None or record.binding_key != binding_key or CAP_CONTROL not in record.capabilities:
            return None
        return record

    async def sent(self, keyboard: Keyboard, message_id: int | None) -> Keyboard:
        """Telegram accepted the message that carries ``keyboard``: presses must come from it."""
        if message_id is None or keyboard.message_id == message_id:
            return keyboard
        await self.repo.set_message(keyboard.token, message_id, self._term.authority())
        return dataclasses.replace(keyboard, message_id=message_id)
