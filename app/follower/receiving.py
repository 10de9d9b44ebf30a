"""Handing deliveries to a follower's callbacks: once each, in order, receipts after the callback.

Messages (and ``media`` items, for a client that asked for them), edits and button presses share
one ordered queue; ``control`` items (``/interrupt``, ``/kill``,
``/eof``) have their own, so that a control never waits behind a message the agent has not taken
yet. An item is acknowledged (the receipt is sent) only after its callback returned; a callback that
raises leaves it unacknowledged, and :class:`~topicbus.follower.model.DeliveryDeclined` does so
quietly. Duplicates (the same ``deliveryId`` again, after a reconnect) are acknowledged without
calling the callback again.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from loguru import logger

from topicbus.follower.model import ButtonPress, Control, Delivery, DeliveryDeclined, Edit
from topicbus.protocol import ButtonItem, ControlItem, Deliver, EditItem, MediaItem, MessageItem

__all__ = ["DELIVERY_MEMORY", "Receiver"]

#: How many delivery ids the client remembers to drop duplicates (LRU).
DELIVERY_MEMORY = 10_000

Callback = Callable[[Any], Awaitable[None]]
#: Sends a delivery's receipt (``bus.ack``) on the socket it came on.
Acknowledge: TypeAlias = Callable[[], Awaitable[None]]


class Receiver:
    """The delivery side of one :class:`~topicbus.follower.client.FollowerClient`."""

    def __init__(self, *, on_delivery: Callable[[Delivery], Awaitable[None]] | None,
                 on_control: Callable[[Control], Awaitable[None]] | None,
                 on_button: Callable[[ButtonPress], Awaitable[None]] | None,
                 on_edit: Callable[[Edit], Awaitable[None]] | None = None, media: bool = False,
                 stopping: Callable[[], bool]):
        self._on_delivery = on_delivery
        self._on_control = on_control
        self._on_button = on_button
        self._on_edit = on_edit
        self._media = media
        self._stopping = stopping
        self._receiving = True
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._ordered: asyncio.Queue[tuple[Deliver, Acknowledge]] = asyncio.Queue()
        self._controls: asyncio.Queue[tuple[Deliver, Acknowledge]] = asyncio.Queue()
        self._workers: list[asyncio.Task[None]] = []

    def start(self, name: str) -> None:
        """Start the two workers (messages, controls)."""
        self._workers = [asyncio.create_task(self._worker(self._ordered), name=f"follower-deliveries:{name}"),
                         asyncio.create_task(self._worker(self._controls), name=f"follower-controls:{name}")]

    async def close(self) -> None:
        """Stop the workers (a callback running is cancelled)."""
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()
        for result in await asyncio.gather(*workers, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                logger.opt(exception=result).error("follower: background task failed")

    def stop(self) -> None:
        """Take nothing more: queued and later items stay unacknowledged (the leader keeps them)."""
        self._receiving = False

    def push(self, frame: Deliver, acknowledge: Acknowledge) -> None:
        """A delivery arrived; ``acknowledge`` sends its receipt once it is taken."""
        queue = self._controls if isinstance(frame.item, ControlItem) else self._ordered
        queue.put_nowait((frame, acknowledge))

    async def _worker(self, queue: asyncio.Queue[tuple[Deliver, Acknowledge]]) -> None:
        """Hand the items of ``queue`` to their callback one at a time, in arrival order, then send receipts."""
        while True:
            frame, acknowledge = await queue.get()
            delivery_id = frame.id
            if self._stopping() or not self._receiving:
                continue  # not acknowledged: the leader keeps it and redelivers
            if delivery_id in self._seen:
                self._seen.move_to_end(delivery_id)
                await acknowledge()
                continue
            handler, value = self._handler_of(frame)
            if value is None:
                logger.warning("follower: ignoring a {} delivery this client did not ask for", frame.item.type)
                continue  # not acknowledged: a leader that sends what was not advertised is wrong
            if handler is not None:
                try:
                    await handler(value)
                except asyncio.CancelledError:
                    raise
                except DeliveryDeclined as exc:
                    logger.info("follower: delivery {} not taken ({}); the leader keeps it", delivery_id, exc)
                    continue
                except Exception as exc:
                    logger.opt(exception=exc).error("follower: on_delivery failed; the leader will redeliver")
                    continue
            self._seen[delivery_id] = None
            while len(self._seen) > DELIVERY_MEMORY:
                self._seen.popitem(last=False)
            await acknowledge()

    def _handler_of(self, frame: Deliver) -> tuple[Callback | None, Any]:
        """The callback for a delivery and its argument; ``(None, None)`` for a type not advertised."""
        item = frame.item
        if isinstance(item, MessageItem) or (isinstance(item, MediaItem) and self._media):
            return self._on_delivery, delivery_of(frame)
        if isinstance(item, EditItem) and self._on_edit is not None:
            return self._on_edit, Edit(delivery_id=frame.id, message_id=item.message_id, text=item.text)
        if isinstance(item, ControlItem) and self._on_control is not None:
            return self._on_control, Control(delivery_id=frame.id, action=item.action, message_id=item.message_id)
        if isinstance(item, ButtonItem) and self._on_button is not None:
            return self._on_button, ButtonPress(delivery_id=frame.id, data=item.data, message_id=item.message_id,
                                                from_user_id=item.from_user_id)
        return None, None


def delivery_of(frame: Deliver) -> Delivery:
    """A ``message`` or ``media`` delivery as the public :class:`Delivery`."""
    item = frame.item
    assert isinstance(item, MessageItem | MediaItem)
    reply = item.reply.model_dump(by_alias=True) if item.reply is not None else None
    if isinstance(item, MediaItem):
        files = [f.model_dump(by_alias=True) for f in item.files]
        first = next((f for f in files if not f["tooLarge"]), files[0])
        document = {key: first[key] for key in ("fileId", "fileName", "mimeType", "fileSize")}
        return Delivery(delivery_id=frame.id, text=None, caption=item.caption, message_id=item.message_id,
                        from_user_id=item.from_user_id, from_name=item.from_name, date=item.date,
                        document=document, reply=reply, files=files)
    return Delivery(
        delivery_id=frame.id,
        text=item.text,
        caption=item.caption,
        message_id=item.message_id,
        from_user_id=item.from_user_id,
        from_name=item.from_name,
        date=item.date,
        document=item.document.model_dump(by_alias=True) if item.document is not None else None,
        reply=reply,
        transcribed_from=item.transcribed_from.model_dump(by_alias=True) if item.transcribed_from is not None else None,
    )
