"""Owner messages in a follower's topic → the router (journal, then deliver)."""

from __future__ import annotations

from typing import Any

from telegram import Message, Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from topicbus.handlers.filters import InThread, owner_messages
from topicbus.leader.routing import Router
from topicbus.leader.topics import ControlTopic
from topicbus.protocol import message_item


def message_payload(message: Message) -> dict[str, Any] | None:
    """What a follower receives for one owner message; None when there is nothing to route."""
    user = message.from_user
    if user is None or user.is_bot:
        return None
    document: dict[str, Any] | None = None
    if message.document is not None:
        doc = message.document
        document = {"fileId": doc.file_id, "fileName": doc.file_name or "document", "mimeType": doc.mime_type,
                    "fileSize": doc.file_size}
    elif message.photo:
        photo = message.photo[-1]
        document = {"fileId": photo.file_id, "fileName": "photo.jpg", "mimeType": "image/jpeg",
                    "fileSize": photo.file_size}
    if message.text is None and message.caption is None and document is None:
        return None
    return message_item(text=message.text, caption=message.caption, messageId=message.message_id,
                        fromUserId=user.id, fromName=user.full_name, date=int(message.date.timestamp()),
                        document=document)


def register(app: Application, *, router: Router, control: ControlTopic, chat_id: int,
             owner_ids: frozenset[int]) -> None:
    async def route(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        if message is None or message.message_thread_id is None:
            return
        payload = message_payload(message)
        if payload is None:
            return
        await router.route_owner_message(update.update_id, message.chat_id, message.message_thread_id, payload)

    not_control = ~InThread(lambda: control.thread_id)
    app.add_handler(MessageHandler(
        owner_messages(chat_id, owner_ids) & filters.IS_TOPIC_MESSAGE & not_control & ~filters.StatusUpdate.ALL
        & filters.UpdateType.MESSAGE, route), group=1)
