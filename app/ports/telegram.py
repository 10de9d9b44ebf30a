"""The Telegram port: the Bot API calls the leader's use cases make.

Every call answers a :class:`~topicbus.core.telegram.CallResult` (never a Telegram exception);
where a call's value is a message or thread id, it is in ``value``. Topics and places to send to
are :class:`~topicbus.core.target.Target`; a message already sent is (chat id, message id).
Implemented by ``bot/gateway.TelegramGateway``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from topicbus.core.formatting import Rendered
from topicbus.core.target import Target
from topicbus.core.telegram import CallResult, InlineKeys


@runtime_checkable
class FileDownload(Protocol):
    """An open download of a Telegram file: its size when Telegram announced one, and its bytes in
    chunks read as they are asked for (:class:`~topicbus.core.telegram.DownloadInterrupted` when
    they stop before the end)."""

    size: int | None

    def chunks(self) -> AsyncIterator[bytes]: ...


class Telegram(Protocol):
    """The Bot API calls of a leadership term."""

    async def create_topic(self, chat_id: int, name: str, icon_color: int | None = None) -> CallResult:
        """A new forum topic; the value is its thread id."""
        ...

    async def edit_topic(self, topic: Target, name: str) -> CallResult: ...

    async def close_topic(self, topic: Target) -> CallResult: ...

    async def reopen_topic(self, topic: Target) -> CallResult: ...

    async def delete_topic(self, topic: Target) -> CallResult: ...

    async def send_message(self, target: Target, message: Rendered, *, silent: bool = False,
                           buttons: InlineKeys | None = None, reply_to: int | None = None) -> CallResult:
        """A text message (the value is its message id), with an inline keyboard when ``buttons``
        are given, as a reply to ``reply_to`` when given."""
        ...

    async def edit_message(self, chat_id: int, message_id: int, message: Rendered, *,
                           buttons: InlineKeys | None = None) -> CallResult:
        """Replace a message's text; it keeps an inline keyboard only if ``buttons`` are given again."""
        ...

    async def edit_buttons(self, chat_id: int, message_id: int, buttons: InlineKeys | None) -> CallResult:
        """Replace (or, with None, remove) a message's inline keyboard."""
        ...

    async def send_chat_action(self, target: Target, action: str) -> CallResult: ...

    async def send_document(self, target: Target, file_name: str, data: bytes, caption: Rendered | None, *,
                            silent: bool = False, buttons: InlineKeys | None = None) -> CallResult:
        """A file; the value is its message id."""
        ...

    async def send_photo(self, target: Target, file_name: str, data: bytes, caption: Rendered | None, *,
                         silent: bool = False) -> CallResult:
        """An image shown as a photo; the value is its message id."""
        ...

    async def set_message_reaction(self, chat_id: int, message_id: int, emoji: str) -> CallResult: ...

    async def answer_callback_query(self, query_id: str, text: str | None = None, *,
                                    alert: bool = False) -> CallResult:
        """Answer a button press: a toast, or with ``alert`` a dialog."""
        ...

    def open_download(self, file_id: str) -> AbstractAsyncContextManager[CallResult]:
        """A file's bytes as a stream: the result's value is a :class:`FileDownload`, read inside the
        ``async with`` block."""
        ...
