"""Owner messages and edits in a follower's topic → the router (journal, then deliver).

What each message becomes (the canonical item, see ``leader/inbound``):

* text → a ``message`` item. ``//text`` reaches the agent as ``/text``, and a command addressed to
  this bot (``/help@bot``) loses its ``@bot`` (reserved commands never get here: ``agent_commands``);
* a message with a file (document, photo, voice, audio, video, video note, animation) → a ``media``
  item with the file's kind, duration, size and whether it is over the 20 MB bots may download;
  album parts carry their ``media_group_id`` to the router, which delivers the album as one item;
* a reply → the ``reply`` context: the replied-to message's text (else caption), its sender, whether
  it was posted by the bot (the agent's own output) and the quoted part;
* an edited message → an ``edit`` item (the message id and the new text, else caption).

This is the Telegram edge of the inbound items: a PTB message becomes a record of
``core/records`` here, and nothing past it sees Telegram's objects.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from telegram import Message, Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from topicbus.core.records import EditItem, FileRef, InboundItem, MediaItem, MessageItem, ReplyContext
from topicbus.handlers.filters import NOT_STATUS_UPDATE, InThread, owner_messages
from topicbus.leader.agent_commands import parse_reserved
from topicbus.leader.inbound import is_too_large
from topicbus.leader.routing import InboundBatches, Router
from topicbus.leader.topics import ControlTopic

_ADDRESSED = re.compile(r"/([A-Za-z0-9_]+)@([A-Za-z0-9_]+)")


def owner_text(text: str, bot_username: str | None) -> str:
    """The text the agent receives: ``//x`` → ``/x``; ``/cmd@thisbot rest`` → ``/cmd rest``;
    everything else verbatim."""
    if text.startswith("//"):
        return text[1:]
    match = _ADDRESSED.match(text)
    if match and bot_username and match.group(2).lower() == bot_username.lower():
        return f"/{match.group(1)}{text[match.end():]}"
    return text


def _seconds(value: int | timedelta | None) -> int | None:
    if value is None:
        return None
    return int(value.total_seconds()) if isinstance(value, timedelta) else int(value)


def _file(kind: str, media: Any, file_name: str, mime_type: str | None, *, duration: bool = True) -> FileRef:
    size = getattr(media, "file_size", None)
    return FileRef(file_id=media.file_id, file_name=file_name, mime_type=mime_type, file_size=size, kind=kind,
                   duration=_seconds(getattr(media, "duration", None)) if duration else None,
                   too_large=is_too_large(size))


def message_files(message: Message) -> list[FileRef]:
    """The file a message carries; [] for a message without one."""
    if message.animation is not None:  # Telegram sets `document` too for animations
        a = message.animation
        return [_file("animation", a, a.file_name or "animation.mp4", a.mime_type or "video/mp4")]
    if message.document is not None:
        d = message.document
        return [_file("document", d, d.file_name or "document", d.mime_type, duration=False)]
    if message.photo:
        return [_file("photo", message.photo[-1], "photo.jpg", "image/jpeg", duration=False)]
    if message.voice is not None:
        v = message.voice
        return [_file("voice", v, "voice.ogg", v.mime_type or "audio/ogg")]
    if message.audio is not None:
        audio = message.audio
        return [_file("audio", audio, audio.file_name or "audio.mp3", audio.mime_type or "audio/mpeg")]
    if message.video is not None:
        video = message.video
        return [_file("video", video, video.file_name or "video.mp4", video.mime_type or "video/mp4")]
    if message.video_note is not None:
        return [_file("video_note", message.video_note, "video_note.mp4", "video/mp4")]
    return []


def reply_context(message: Message, bot_id: int | None) -> ReplyContext | None:
    """What the message replied to. In a forum topic every message "replies" to the topic's
    creation message when it replies to nothing: that is not a reply."""
    replied = message.reply_to_message
    if replied is None or replied.forum_topic_created is not None or (
            message.message_thread_id is not None and replied.message_id == message.message_thread_id):
        return None
    sender = replied.from_user
    if sender is not None:
        from_name: str | None = sender.full_name
    else:
        from_name = replied.sender_chat.title if replied.sender_chat is not None else None
    return ReplyContext(message_id=replied.message_id,
                        text=replied.text if replied.text is not None else replied.caption, from_name=from_name,
                        from_agent=sender is not None and bot_id is not None and sender.id == bot_id,
                        quote=message.quote.text if message.quote is not None else None)


def message_payload(message: Message, *, bot_id: int | None = None,
                    bot_username: str | None = None) -> MessageItem | MediaItem | None:
    """The item journaled for one owner message; None when there is nothing to route."""
    user = message.from_user
    if user is None or user.is_bot:
        return None
    date = int(message.date.timestamp())
    reply = reply_context(message, bot_id)
    files = message_files(message)
    if files:
        return MediaItem(files=tuple(files), caption=message.caption, message_id=message.message_id,
                         from_user_id=user.id, from_name=user.full_name, date=date, reply=reply)
    if message.text is None:
        return None
    return MessageItem(text=owner_text(message.text, bot_username), message_id=message.message_id,
                       from_user_id=user.id, from_name=user.full_name, date=date, reply=reply)


def edit_payload(message: Message, *, bot_username: str | None = None) -> EditItem | None:
    """The item journaled for an edited owner message; None when there is nothing to tell the agent
    (no text or caption, or the new text is a reserved command: an edit never runs a command)."""
    user = message.from_user
    if user is None or user.is_bot:
        return None
    if message.text is not None:
        if parse_reserved(message.text, bot_username) is not None:
            return None
        return EditItem(message.message_id, owner_text(message.text, bot_username))
    if message.caption is not None:
        return EditItem(message.message_id, message.caption)
    return None


def register(app: Application, *, router: Router, batches: InboundBatches, control: ControlTopic, chat_id: int,
             owner_ids: frozenset[int]) -> None:
    """Each owner message goes to the router with the ``getUpdates`` answer it came in
    (``batches.current``): journaled with the rest of that answer, before the poller confirms it."""
    async def route(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        if message is None or message.message_thread_id is None:
            return
        payload: InboundItem | None = message_payload(message, bot_id=context.bot.id,
                                                      bot_username=context.bot.username)
        if payload is None:
            return
        await router.route_owner_message(update.update_id, message.chat_id, message.message_thread_id, payload,
                                         media_group=message.media_group_id, batch=batches.current)

    async def edited(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.edited_message
        if message is None or message.message_thread_id is None:
            return
        payload = edit_payload(message, bot_username=context.bot.username)
        if payload is None:
            return
        await router.route_owner_message(update.update_id, message.chat_id, message.message_thread_id, payload,
                                         batch=batches.current)

    where = (owner_messages(chat_id, owner_ids) & filters.IS_TOPIC_MESSAGE & ~InThread(lambda: control.thread_id)
             & NOT_STATUS_UPDATE)
    app.add_handler(MessageHandler(where & filters.UpdateType.MESSAGE, route), group=1)
    app.add_handler(MessageHandler(where & filters.UpdateType.EDITED_MESSAGE, edited), group=1)
