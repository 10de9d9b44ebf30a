"""The receipt reaction: the owner sees on the phone that the agent has the message.

When a follower's receipt newly settles a journal row (each row once, however often it was
redelivered), the owner message behind it gets a reaction (default 👀,
``TOPICBUS_RECEIPT_REACTION``; ``off`` switches it off). Only owner messages and media get one;
edits, items a follower does not take, dropped and expired rows do not. An album gets one
reaction, on its first message.

A reaction is the least important call the leader makes: it must never delay a message, and it
is skipped rather than queued when the chat is busy. The ``react`` port is the outbound
scheduler's (``ScheduledGateway.set_message_reaction``: lowest priority, dropped under pressure).
Reactions also wait for a pause in the receipts (``quiet_s``, at most ``max_wait_s`` after the
first one waiting): while messages stream in, the leader routes them first and sets their
reactions in the gap after (a Bot API call per message would otherwise run alongside the next
message's routing; the bench measured it tripling the leader-added p99). On a phone the 👀 then
comes a tenth of a second later than it could, or up to two seconds while messages pour in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from loguru import logger

from topicbus.core.records import MediaItem, MessageItem
from topicbus.core.journal import JournalItem

#: ``react(chat_id, message_id, emoji)``: set one reaction; the answer is the gateway's CallResult.
ReactPort = Callable[[int, int, str], Awaitable[Any]]
OFF_VALUES = frozenset({"", "off", "false", "no", "none", "0"})
QUIET_S = 0.1  # reactions wait for this pause in the receipts...
MAX_WAIT_S = 2.0  # ...but never longer than this after the first one waiting


def reaction_emoji(setting: str | None) -> str | None:
    """The configured emoji, or None when reactions are off."""
    if setting is None or setting.strip().lower() in OFF_VALUES:
        return None
    return setting.strip()


def reacted_messages(items: list[JournalItem]) -> list[int]:
    """The owner message ids that newly delivered rows stand for, each once, in order."""
    ids: dict[int, None] = {}
    for item in items:
        payload = item.payload
        if isinstance(payload, MessageItem | MediaItem) and isinstance(payload.message_id, int):
            ids[payload.message_id] = None
    return list(ids)


class ReceiptReactions:
    def __init__(self, *, react: ReactPort, chat_id: int, emoji: str | None,
                 spawn: Callable[[Coroutine[Any, Any, Any]], None], quiet_s: float = QUIET_S,
                 max_wait_s: float = MAX_WAIT_S):
        self._react = react
        self._chat_id = chat_id
        self.emoji = emoji
        self._spawn = spawn
        self._quiet_s = quiet_s
        self._max_wait_s = max_wait_s
        self._waiting: dict[int, None] = {}  # message ids whose reaction waits for a pause, in order
        self._first_at = 0.0  # when the oldest waiting one arrived (loop time)
        self._last_at = 0.0  # when the newest one arrived
        self._setting = False  # the task that sets them is running
        self.requested = 0
        self.failed = 0

    async def on_delivered(self, items: list[JournalItem]) -> None:
        """The delivery hub's hook: rows a receipt settled. Never waits for Telegram."""
        if self.emoji is None:
            return
        ids = [message_id for message_id in reacted_messages(items) if message_id not in self._waiting]
        if not ids:
            return
        now = asyncio.get_running_loop().time()
        if not self._waiting:
            self._first_at = now
        self._last_at = now
        for message_id in ids:
            self.requested += 1
            self._waiting[message_id] = None
        if not self._setting:
            self._setting = True
            self._spawn(self._set_after_pause())

    async def _set_after_pause(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                due = min(self._last_at + self._quiet_s, self._first_at + self._max_wait_s)
                if loop.time() < due:
                    await asyncio.sleep(due - loop.time())
                    continue
                batch, self._waiting = list(self._waiting), {}
                for message_id in batch:
                    await self._set(message_id)
        finally:
            self._setting = False

    async def _set(self, message_id: int) -> None:
        assert self.emoji is not None
        try:
            result = await self._react(self._chat_id, message_id, self.emoji)
        except Exception as exc:  # noqa: BLE001 - a reaction is never worth a failure
            result = None
            logger.bind(phase="reaction").debug("reaction failed ({})", type(exc).__name__)
        if result is not None and not getattr(result, "ok", True):
            self.failed += 1
            logger.bind(phase="reaction").debug("reaction on message {} skipped ({})", message_id,
                                                getattr(result, "outcome", "?"))
