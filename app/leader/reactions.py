"""The receipt reaction: the owner sees on the phone that the agent has the message.

When a follower's receipt newly settles a journal row (each row once, however often it was
redelivered), the owner message behind it gets a reaction (default 👀,
``TOPICBUS_RECEIPT_REACTION``; ``off`` switches it off). Only owner messages and media get one;
edits, items a follower does not take, dropped and expired rows do not. An album gets one
reaction, on its first message.

A reaction is the least important call the leader makes: it must never delay a message, and it
is skipped rather than queued when the chat is busy. The ``react`` port is the outbound
scheduler's (``ScheduledGateway.set_message_reaction``: lowest priority, dropped under pressure).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from loguru import logger

from topicbus.storage.journal import JournalItem

#: ``react(chat_id, message_id, emoji)``: set one reaction; the answer is the gateway's CallResult.
ReactPort = Callable[[int, int, str], Awaitable[Any]]
REACTED_ITEMS = frozenset({"message", "media"})
OFF_VALUES = frozenset({"", "off", "false", "no", "none", "0"})


def reaction_emoji(setting: str | None) -> str | None:
    """The configured emoji, or None when reactions are off."""
    if setting is None or setting.strip().lower() in OFF_VALUES:
        return None
    return setting.strip()


def reacted_messages(items: list[JournalItem]) -> list[int]:
    """The owner message ids that newly delivered rows stand for, each once, in order."""
    ids: dict[int, None] = {}
    for item in items:
        message_id = item.payload.get("messageId")
        if item.payload.get("type") in REACTED_ITEMS and isinstance(message_id, int):
            ids[message_id] = None
    return list(ids)


class ReceiptReactions:
    def __init__(self, *, react: ReactPort, chat_id: int, emoji: str | None,
                 spawn: Callable[[Coroutine[Any, Any, Any]], None]):
        self._react = react
        self._chat_id = chat_id
        self.emoji = emoji
        self._spawn = spawn
        self.requested = 0
        self.failed = 0

    async def on_delivered(self, items: list[JournalItem]) -> None:
        """The delivery hub's hook: rows a receipt settled. Never waits for Telegram."""
        if self.emoji is None:
            return
        for message_id in reacted_messages(items):
            self.requested += 1
            self._spawn(self._set(message_id))

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
