"""Filters shared by the handlers: who may talk to the bot, and where."""

from __future__ import annotations

from collections.abc import Callable

from telegram import Message, Update
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


class _NotStatusUpdate(filters.UpdateFilter):
    """PTB's ``~filters.StatusUpdate.ALL``, worked out once per update.

    PTB's filter asks some 46 kinds of service message one by one, and three handlers (the turn, the
    routing and the outside hint) ask it of every owner message: the profile of a paced inbound run
    had it at a sixth of the leader's dispatch time. The answer for an update never changes, so it is
    kept for the update object last asked about (by identity: the handlers of one dispatch share it)."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        super().__init__(name="~filters.StatusUpdate.ALL")
        self._last: tuple[Update | None, bool] = (None, False)

    def filter(self, update: Update) -> bool:
        last, answer = self._last
        if last is not update:
            answer = not filters.StatusUpdate.ALL.check_update(update)
            self._last = (update, answer)
        return answer


#: Messages that are not service messages (topic created, member joined, …), once per update.
NOT_STATUS_UPDATE = _NotStatusUpdate()
