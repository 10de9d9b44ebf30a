"""Owner messages outside the agent topics (General, or a topic no agent holds) get one short hint
instead of silence, so a newcomer learns where to write. Strangers get nothing."""

from __future__ import annotations

from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from topicbus.core.target import Target
from topicbus.handlers.filters import NOT_STATUS_UPDATE, InThread, owner_messages
from topicbus.leader.notices import Notices
from topicbus.leader.topics import ControlTopic


def register(app: Application, *, notices: Notices, control: ControlTopic, chat_id: int,
             owner_ids: frozenset[int]) -> None:
    async def hint(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        if message is None:
            return
        # In a forum's General topic a reply may carry a thread id without being a topic message.
        await notices.hint_outside(Target(message.chat_id,
                                           message.message_thread_id if message.is_topic_message else None))

    app.add_handler(MessageHandler(
        owner_messages(chat_id, owner_ids) & filters.UpdateType.MESSAGE & NOT_STATUS_UPDATE
        & ~InThread(lambda: control.thread_id), hint), group=2)
