"""Filters shared by the handlers: who may talk to the bot, and where."""

from __future__ import annotations

from collections.abc import Callable

from telegram import Message
from telegram.ext import filters


class InThread(filters.MessageFilter):
    """Messages in one forum topic whose id is read at filter time (it may change on re-provisioning).

    Compose it with PTB's operators: ``~InThread(...)`` is every message outside that topic."""

    def __init__(self, thread_id: Callable[[], int | None]):
        super().__init__(name="InThread")
        self._thread_id = thread_id

    def filter(self, message: Message) -> bool:
        return bool(message.is_topic_message) and message.message_thread_id == self._thread_id()


def owner_messages(chat_id: int, owner_ids: frozenset[int]) -> filters.BaseFilter:
    """From an owner (never a bot), in our chat."""
    return filters.Chat(chat_id=chat_id) & filters.User(user_id=list(owner_ids)) & ~filters.VIA_BOT
