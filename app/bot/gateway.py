"""Telegram adapter: the few Bot API calls topicbus makes, with errors classified once.

Classification (python-ecosystem-notes §1.4): ``BadRequest`` is a ``NetworkError`` subclass, so
it is checked first; PTB normalises messages ("Topic_not_modified"), so we match lowercase.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from telegram import (Bot, BotCommand, BotCommandScopeChat, InlineKeyboardButton, InlineKeyboardMarkup, InputFile,
                      MessageEntity, ReactionTypeEmoji, ReplyParameters)
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TelegramError, TimedOut

from topicbus.core.formatting import Rendered


#: An inline keyboard as the leader describes it: rows of (label, callback data).
InlineKeys = Sequence[Sequence[tuple[str, str]]]

TOPIC_GONE_MARKERS = ("message thread not found", "thread not found", "topic_id_invalid", "topic not found",
                      "topic_deleted", "topic deleted")
FORUM_ICON_COLORS = (0x6FB9F0, 0xFFD67E, 0xCB86DB, 0x8EEE98, 0xFF93B2, 0xFB6F5F)


class Outcome(StrEnum):
    OK = "ok"
    NOT_MODIFIED = "not-modified"  # the topic already is in the requested state
    GONE = "gone"  # the topic does not exist (deleted, unknown)
    RETRY_AFTER = "retry-after"  # flood control; try again after ``retry_after_s``
    REJECTED = "rejected"  # Telegram answered a definite "no" (rights, bad request…)
    AMBIGUOUS = "ambiguous"  # timeout / network / 5xx: the call may or may not have happened


@dataclass(frozen=True)
class CallResult:
    outcome: Outcome
    message: str = ""
    retry_after_s: float = 0.0
    value: object = None

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.OK, Outcome.NOT_MODIFIED)


_BOT_URL_TOKEN = re.compile(r"(/(?:file/)?bot)[^/\s\"']+")


def redact_bot_urls(text: str) -> str:
    """Bot API URLs carry the token (``…/bot<token>/getMe``); this keeps the URL and drops the token."""
    return _BOT_URL_TOKEN.sub(r"\1<token>", text)


def retry_after_seconds(exc: RetryAfter) -> float:
    """Telegram's flood-control wait in seconds. PTB reports it as a ``timedelta`` with
    ``PTB_TIMEDELTA=true`` (``make run``, the Docker image) and as a number otherwise."""
    delay = exc.retry_after
    return max(delay.total_seconds() if isinstance(delay, timedelta) else float(delay), 0.0)


def classify(exc: BaseException) -> CallResult:
    """Every Telegram failure, in one place, as the :class:`Outcome` the callers act on."""
    if isinstance(exc, RetryAfter):
        return CallResult(Outcome.RETRY_AFTER, str(exc), retry_after_s=retry_after_seconds(exc))
    if isinstance(exc, BadRequest):
        text = exc.message.lower()
        if "topic_not_modified" in text or "not modified" in text:
            return CallResult(Outcome.NOT_MODIFIED, exc.message)
        if any(marker in text for marker in TOPIC_GONE_MARKERS):
            return CallResult(Outcome.GONE, exc.message)
        return CallResult(Outcome.REJECTED, exc.message)
    if isinstance(exc, Forbidden):
        return CallResult(Outcome.REJECTED, exc.message)
    if isinstance(exc, TimedOut | NetworkError):
        return CallResult(Outcome.AMBIGUOUS, getattr(exc, "message", str(exc)))
    if isinstance(exc, TelegramError):
        return CallResult(Outcome.REJECTED, exc.message)
    return CallResult(Outcome.AMBIGUOUS, f"{type(exc).__name__}")


class TelegramGateway:
    """Outbound Bot API calls; every method returns a :class:`CallResult`, never raises Telegram errors."""

    def __init__(self, bot: Bot):
        self.bot = bot

    async def _call(self, coro) -> CallResult:
        try:
            value = await coro
        except Exception as exc:  # noqa: BLE001 - classified, never swallowed silently
            return classify(exc)
        return CallResult(Outcome.OK, value=value)

    async def create_topic(self, chat_id: int, name: str, icon_color: int | None = None) -> CallResult:
        result = await self._call(self.bot.create_forum_topic(chat_id=chat_id, name=name[:128], icon_color=icon_color))
        if result.outcome is Outcome.OK:
            return CallResult(Outcome.OK, value=result.value.message_thread_id)
        return result

    async def edit_topic(self, chat_id: int, thread_id: int, name: str) -> CallResult:
        return await self._call(self.bot.edit_forum_topic(chat_id=chat_id, message_thread_id=thread_id, name=name[:128]))

    async def close_topic(self, chat_id: int, thread_id: int) -> CallResult:
        return await self._call(self.bot.close_forum_topic(chat_id=chat_id, message_thread_id=thread_id))

    async def delete_topic(self, chat_id: int, thread_id: int) -> CallResult:
        return await self._call(self.bot.delete_forum_topic(chat_id=chat_id, message_thread_id=thread_id))

    async def reopen_topic(self, chat_id: int, thread_id: int) -> CallResult:
        return await self._call(self.bot.reopen_forum_topic(chat_id=chat_id, message_thread_id=thread_id))

    async def send_message(self, chat_id: int, thread_id: int | None, message: Rendered, *, silent: bool = False,
                           buttons: InlineKeys | InlineKeyboardMarkup | None = None,
                           reply_to: int | None = None) -> CallResult:
        """A text message, with an inline keyboard when ``buttons`` are given, as a reply to the message
        ``reply_to`` when given (sent all the same if that message is gone); the value is its message id."""
        reply = None if reply_to is None else ReplyParameters(message_id=reply_to, allow_sending_without_reply=True)
        result = await self._call(self.bot.send_message(
            chat_id=chat_id, message_thread_id=thread_id, text=message.text, entities=_entities(message),
            parse_mode=message.parse_mode, disable_notification=silent, reply_markup=_markup(buttons),
            reply_parameters=reply))
        return _message_id(result)

    async def edit_message(self, chat_id: int, message_id: int, message: Rendered, *,
                           buttons: InlineKeys | InlineKeyboardMarkup | None = None) -> CallResult:
        """Replace a message's text ("message is not modified" counts as success). The message keeps
        an inline keyboard only if ``buttons`` are given again: Telegram removes it otherwise."""
        return await self._call(self.bot.edit_message_text(
            chat_id=chat_id, message_id=message_id, text=message.text, entities=_entities(message),
            parse_mode=message.parse_mode, reply_markup=_markup(buttons)))

    async def edit_buttons(self, chat_id: int, message_id: int,
                           buttons: InlineKeys | InlineKeyboardMarkup | None) -> CallResult:
        """Replace (or, with None, remove) a message's inline keyboard."""
        return await self._call(self.bot.edit_message_reply_markup(chat_id=chat_id, message_id=message_id,
                                                                   reply_markup=_markup(buttons)))

    async def answer_callback_query(self, query_id: str, text: str | None = None, *,
                                    alert: bool = False) -> CallResult:
        """Answer a button press (the client stops its spinner): a short toast, or with ``alert`` a
        dialog the presser has to dismiss. Telegram allows one answer per query, within seconds."""
        return await self._call(self.bot.answer_callback_query(callback_query_id=query_id, text=text,
                                                               show_alert=alert))

    async def send_chat_action(self, chat_id: int, thread_id: int | None, action: str) -> CallResult:
        return await self._call(self.bot.send_chat_action(chat_id=chat_id, message_thread_id=thread_id, action=action))

    async def send_document(self, chat_id: int, thread_id: int | None, file_name: str, data: bytes,
                            caption: Rendered | None, *, silent: bool = False,
                            buttons: InlineKeys | None = None) -> CallResult:
        """A file; the value is its message id."""
        return _message_id(await self._call(self.bot.send_document(
            chat_id=chat_id, message_thread_id=thread_id, document=io.BytesIO(data), filename=file_name,
            caption=caption.text if caption else None, caption_entities=_entities(caption),
            parse_mode=caption.parse_mode if caption else None, disable_notification=silent,
            reply_markup=_markup(buttons))))

    async def send_photo(self, chat_id: int, thread_id: int | None, file_name: str, data: bytes,
                         caption: Rendered | None, *, silent: bool = False) -> CallResult:
        """An image shown as a photo; the value is its message id."""
        return _message_id(await self._call(self.bot.send_photo(
            chat_id=chat_id, message_thread_id=thread_id, photo=InputFile(io.BytesIO(data), filename=file_name),
            caption=caption.text if caption else None, caption_entities=_entities(caption),
            parse_mode=caption.parse_mode if caption else None, disable_notification=silent)))

    async def set_message_reaction(self, chat_id: int, message_id: int, emoji: str) -> CallResult:
        """One emoji reaction on a message (replacing the bot's earlier one). Telegram accepts only
        emoji from its reaction list (👀, 👍, ✍ …); anything else is REACTION_INVALID (rejected)."""
        return await self._call(self.bot.set_message_reaction(chat_id=chat_id, message_id=message_id,
                                                              reaction=[ReactionTypeEmoji(emoji)]))

    async def get_chat(self, chat_id: int) -> CallResult:
        """``getChat``: the chat's type and whether it is a forum (``value`` is PTB's ``ChatFullInfo``)."""
        return await self._call(self.bot.get_chat(chat_id=chat_id))

    async def get_chat_member(self, chat_id: int, user_id: int) -> CallResult:
        """``getChatMember``: a member's status and rights (``value`` is PTB's ``ChatMember``)."""
        return await self._call(self.bot.get_chat_member(chat_id=chat_id, user_id=user_id))

    async def get_commands(self, chat_id: int) -> CallResult:
        """The command menu set for ``chat_id`` (``BotCommandScopeChat``), as (command, description) pairs."""
        result = await self._call(self.bot.get_my_commands(scope=BotCommandScopeChat(chat_id)))
        if result.outcome is Outcome.OK:
            return CallResult(Outcome.OK, value=[(c.command, c.description) for c in result.value])
        return result

    async def set_commands(self, chat_id: int, commands: Sequence[tuple[str, str]]) -> CallResult:
        """Set the command menu every member of ``chat_id`` sees (menus are per chat, not per topic)."""
        return await self._call(self.bot.set_my_commands([BotCommand(c, d) for c, d in commands],
                                                         scope=BotCommandScopeChat(chat_id)))

    async def download(self, file_id: str) -> CallResult:
        """getFile + download; Bot API bots can fetch files up to 20 MB."""
        async def fetch() -> bytes:
            file = await self.bot.get_file(file_id)
            return bytes(await file.download_as_bytearray())

        return await self._call(fetch())


def _markup(buttons: InlineKeys | InlineKeyboardMarkup | None) -> InlineKeyboardMarkup | None:
    if buttons is None or isinstance(buttons, InlineKeyboardMarkup):
        return buttons
    return InlineKeyboardMarkup([[InlineKeyboardButton(text, callback_data=data) for text, data in row]
                                 for row in buttons])


def _entities(message: Rendered | None) -> list[MessageEntity] | None:
    if message is None or not message.entities:
        return None
    return [MessageEntity(type=e.type, offset=e.offset, length=e.length, language=e.language, url=e.url)
            for e in message.entities]


def _message_id(result: CallResult) -> CallResult:
    if result.outcome is Outcome.OK and result.value is not None and hasattr(result.value, "message_id"):
        return CallResult(Outcome.OK, value=result.value.message_id)
    return result
