"""Topic service messages (closed, reopened, edited) keep the store in step with Telegram."""

from __future__ import annotations

from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from topicbus.core.target import Target
from topicbus.leader.topics import TopicEvents


def register(app: Application, *, topics: TopicEvents, chat_id: int, owner_ids: frozenset[int]) -> None:
    async def topic_event(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        if message is None or message.message_thread_id is None:
            return
        if message.forum_topic_closed is not None:
            await topics.state_changed(Target(message.chat_id, message.message_thread_id), "closed")
        elif message.forum_topic_reopened is not None:
            await topics.state_changed(Target(message.chat_id, message.message_thread_id), "open")
        elif (message.forum_topic_edited is not None and message.forum_topic_edited.name
              and message.from_user is not None and message.from_user.id in owner_ids):
            # Only an owner's rename becomes the topic's manual name; others' renames are not adopted.
            await topics.renamed(Target(message.chat_id, message.message_thread_id), message.forum_topic_edited.name)

    app.add_handler(MessageHandler(
        filters.Chat(chat_id=chat_id) & (filters.StatusUpdate.FORUM_TOPIC_CLOSED
                                         | filters.StatusUpdate.FORUM_TOPIC_REOPENED
                                         | filters.StatusUpdate.FORUM_TOPIC_EDITED), topic_event), group=0)
