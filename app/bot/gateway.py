"""Telegram adapter: the few Bot API calls topicbus makes, with errors classified once.

Classification (python-ecosystem-notes §1.4): ``BadRequest`` is a ``NetworkError`` subclass, so
it is checked first; PTB normalises messages ("Topic_not_modified"), so we match lowercase.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import aiohttp
from telegram import (Bot, BotCommand, BotCommandScopeChat, InlineKeyboardButton, InlineKeyboardMarkup, InputFile,
                      MessageEntity, ReactionTypeEmoji, ReplyParameters)
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TelegramError, TimedOut

from topicbus.bot.application import telegram_tls_context
from topicbus.core.formatting import Rendered
from topicbus.core.target import Target
from topicbus.core.telegram import CallOutcome, CallResult, DownloadInterrupted, InlineKeys

TOPIC_GONE_MARKERS = ("message thread not found", "thread not found", "topic_id_invalid", "topic not found",
                      "topic_deleted", "topic deleted")
FORUM_ICON_COLORS = (0x6FB9F0, 0xFFD67E, 0xCB86DB, 0x8EEE98, 0xFF93B2, 0xFB6F5F)

DOWNLOAD_CHUNK_BYTES = 64 * 1024  # a file's bytes are read (and passed on) this much at a time
DOWNLOAD_CONNECT_TIMEOUT_S = 10.0
DOWNLOAD_READ_TIMEOUT_S = 30.0  # no byte of a file from Telegram for this long: the download failed


_BOT_URL_TOKEN = re.compile(r"(/(?:file/)?bot)[^/\s\"']+")


def redact_bot_urls(text: str) -> str:
    """Bot API URLs carry the token (``…/bot<token>/getMe``); this keeps the URL and drops the token."""
    return _BOT_URL_TOKEN.sub(r"\1<token>", text)


def describe_download_error(exc: BaseException) -> str:
    """A failed file download in words, without its URL's token (aiohttp puts the URL in some messages)."""
    text = str(exc)
    return redact_bot_urls(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


_GENERAL_TOPIC = CallResult(CallOutcome.REJECTED, "the General topic is not a forum topic this call can change")

class FileStream:
    """An open download of a Telegram file (from :meth:`TelegramGateway.open_download`): its size when
    Telegram announced one, and its bytes in chunks of at most :data:`DOWNLOAD_CHUNK_BYTES`, read from
    the network as they are asked for, so a file is never held whole in memory."""

    def __init__(self, response: aiohttp.ClientResponse, size: int | None):
        self._response = response
        self.size = size

    async def chunks(self) -> AsyncIterator[bytes]:
        """The file's bytes in order; :class:`DownloadInterrupted` when they stop before the end
        or go past the size announced."""
        received = 0
        try:
            async for chunk in self._response.content.iter_chunked(DOWNLOAD_CHUNK_BYTES):
                received += len(chunk)
                if self.size is not None and received > self.size:
                    raise DownloadInterrupted(f"more than the {self.size} bytes announced")
                yield chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DownloadInterrupted(describe_download_error(exc)) from None
        if self.size is not None and received != self.size:
            raise DownloadInterrupted(f"{received} of the {self.size} bytes announced")


def retry_after_seconds(exc: RetryAfter) -> float:
    """Telegram's flood-control wait in seconds. PTB reports it as a ``timedelta`` with
    ``PTB_TIMEDELTA=true`` (set by ``topicbus leader``) and as a number otherwise."""
    delay = exc.retry_after
    return max(delay.total_seconds() if isinstance(delay, timedelta) else float(delay), 0.0)


def classify(exc: BaseException) -> CallResult:
    """Every Telegram failure, in one place, as the :class:`~topicbus.core.telegram.CallOutcome` the callers act on."""
    if isinstance(exc, RetryAfter):
        return CallResult(CallOutcome.RETRY_AFTER, str(exc), retry_after_s=retry_after_seconds(exc))
    if isinstance(exc, BadRequest):
        text = exc.message.lower()
        if "topic_not_modified" in text or "not modified" in text:
            return CallResult(CallOutcome.NOT_MODIFIED, exc.message)
        if any(marker in text for marker in TOPIC_GONE_MARKERS):
            return CallResult(CallOutcome.GONE, exc.message)
        return CallResult(CallOutcome.REJECTED, exc.message)
    if isinstance(exc, Forbidden):
        return CallResult(CallOutcome.REJECTED, exc.message)
    if isinstance(exc, TimedOut | NetworkError):
        return CallResult(CallOutcome.AMBIGUOUS, getattr(exc, "message", str(exc)))
    if isinstance(exc, TelegramError):
        return CallResult(CallOutcome.REJECTED, exc.message)
    return CallResult(CallOutcome.AMBIGUOUS, f"{type(exc).__name__}")


class TelegramGateway:
    """Outbound Bot API calls; every method returns a :class:`CallResult`, never raises Telegram errors."""

    def __init__(self, bot: Bot):
        self.bot = bot

    async def _call(self, coro) -> CallResult:
        try:
            value = await coro
        except Exception as exc:  # noqa: BLE001 - classified, never swallowed silently
            return classify(exc)
        return CallResult(CallOutcome.OK, value=value)

    # A topic call names a forum topic; the chat's General topic (no thread id) is none.
    async def create_topic(self, chat_id: int, name: str, icon_color: int | None = None) -> CallResult:
        result = await self._call(self.bot.create_forum_topic(chat_id=chat_id, name=name[:128], icon_color=icon_color))
        if result.outcome is CallOutcome.OK:
            return CallResult(CallOutcome.OK, value=result.value.message_thread_id)
        return result

    async def edit_topic(self, topic: Target, name: str) -> CallResult:
        if topic.thread_id is None:
            return _GENERAL_TOPIC
        return await self._call(self.bot.edit_forum_topic(chat_id=topic.chat_id, message_thread_id=topic.thread_id,
                                                          name=name[:128]))

    async def close_topic(self, topic: Target) -> CallResult:
        if topic.thread_id is None:
            return _GENERAL_TOPIC
        return await self._call(self.bot.close_forum_topic(chat_id=topic.chat_id, message_thread_id=topic.thread_id))

    async def delete_topic(self, topic: Target) -> CallResult:
        if topic.thread_id is None:
            return _GENERAL_TOPIC
        return await self._call(self.bot.delete_forum_topic(chat_id=topic.chat_id, message_thread_id=topic.thread_id))

    async def reopen_topic(self, topic: Target) -> CallResult:
        if topic.thread_id is None:
            return _GENERAL_TOPIC
        return await self._call(self.bot.reopen_forum_topic(chat_id=topic.chat_id, message_thread_id=topic.thread_id))

    async def send_message(self, target: Target, message: Rendered, *, silent: bool = False,
                           buttons: InlineKeys | InlineKeyboardMarkup | None = None,
                           reply_to: int | None = None) -> CallResult:
        """A text message, with an inline keyboard when ``buttons`` are given, as a reply to the message
        ``reply_to`` when given (sent all the same if that message is gone); the value is its message id."""
        reply = None if reply_to is None else ReplyParameters(message_id=reply_to, allow_sending_without_reply=True)
        result = await self._call(self.bot.send_message(
            chat_id=target.chat_id, message_thread_id=target.thread_id, text=message.text,
            entities=_entities(message), parse_mode=message.parse_mode, disable_notification=silent,
            reply_markup=_markup(buttons), reply_parameters=reply))
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

    async def send_chat_action(self, target: Target, action: str) -> CallResult:
        return await self._call(self.bot.send_chat_action(chat_id=target.chat_id, message_thread_id=target.thread_id,
                                                          action=action))

    async def send_document(self, target: Target, file_name: str, data: bytes,
                            caption: Rendered | None, *, silent: bool = False,
                            buttons: InlineKeys | None = None) -> CallResult:
        """A file; the value is its message id."""
        return _message_id(await self._call(self.bot.send_document(
            chat_id=target.chat_id, message_thread_id=target.thread_id, document=io.BytesIO(data), filename=file_name,
            caption=caption.text if caption else None, caption_entities=_entities(caption),
            parse_mode=caption.parse_mode if caption else None, disable_notification=silent,
            reply_markup=_markup(buttons))))

    async def send_photo(self, target: Target, file_name: str, data: bytes,
                         caption: Rendered | None, *, silent: bool = False) -> CallResult:
        """An image shown as a photo; the value is its message id."""
        return _message_id(await self._call(self.bot.send_photo(
            chat_id=target.chat_id, message_thread_id=target.thread_id,
            photo=InputFile(io.BytesIO(data), filename=file_name),
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
        if result.outcome is CallOutcome.OK:
            return CallResult(CallOutcome.OK, value=[(c.command, c.description) for c in result.value])
        return result

    async def set_commands(self, chat_id: int, commands: Sequence[tuple[str, str]]) -> CallResult:
        """Set the command menu every member of ``chat_id`` sees (menus are per chat, not per topic)."""
        return await self._call(self.bot.set_my_commands([BotCommand(c, d) for c, d in commands],
                                                         scope=BotCommandScopeChat(chat_id)))

    @contextlib.asynccontextmanager
    async def open_download(self, file_id: str) -> AsyncIterator[CallResult]:
        """``getFile``, then the file's bytes as a stream: the result's value is a :class:`FileStream`,
        to be read inside the ``async with`` block (leaving it closes the connection). Bot API bots
        can fetch files up to 20 MB (over it, "file is too big": REJECTED, as is an unknown file).

        The bytes are fetched with aiohttp rather than PTB, whose ``File.download_*`` read a whole
        file into memory first; with the TLS context of PTB's own clients and, like httpx, the
        proxy environment (``HTTPS_PROXY``…). The file's URL carries the bot token: no error names it.
        """
        found = await self._call(self.bot.get_file(file_id))
        if not found.ok:
            yield found
            return
        url, announced = found.value.file_path or "", found.value.file_size
        if not url.startswith(("http://", "https://")):
            yield CallResult(CallOutcome.REJECTED, "Telegram gave no downloadable file path")
            return
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=DOWNLOAD_CONNECT_TIMEOUT_S,
                                        sock_read=DOWNLOAD_READ_TIMEOUT_S)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=telegram_tls_context()),
                                         timeout=timeout, trust_env=True) as session:
            try:
                response = await session.get(url, headers={"Accept-Encoding": "identity"})
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                yield CallResult(CallOutcome.AMBIGUOUS, describe_download_error(exc))
                return
            async with response:
                if response.status != 200:
                    # 4xx: Telegram no longer has the file (a path expires after an hour); else it may be back later.
                    definite = 400 <= response.status < 500 and response.status != 429
                    yield CallResult(CallOutcome.REJECTED if definite else CallOutcome.AMBIGUOUS,
                                     f"file download: HTTP {response.status}")
                    return
                # A compressed body's length is not the file's (the server should not compress: identity asked).
                length = None if response.headers.get("Content-Encoding", "identity") != "identity" else (
                    response.content_length)
                if length is not None and announced and length != announced:
                    yield CallResult(CallOutcome.AMBIGUOUS, f"file download: {length} bytes, {announced} announced")
                    return
                size = length if length is not None else announced
                yield CallResult(CallOutcome.OK, value=FileStream(response, size))


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
    if result.outcome is CallOutcome.OK and result.value is not None and hasattr(result.value, "message_id"):
        return CallResult(CallOutcome.OK, value=result.value.message_id)
    return result
