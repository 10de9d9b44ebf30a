"""A fake Telegram Bot API server for integration and end-to-end tests.

``FakeBotApi`` is an aiohttp server on ``127.0.0.1`` (random free port) that runs in the caller's
event loop. Real python-telegram-bot clients talk to it over HTTP through ``base_url`` /
``base_file_url`` (leader subprocesses get ``TOPICBUS_API_BASE_URL=fake.base_url``).

What it fakes, with Telegram's real error strings and HTTP status codes:

* request parsing as PTB sends it (urlencoded / multipart with JSON-encoded non-string values),
  JSON bodies and query strings; values are coerced per parameter (``text`` stays a string);
* ``getMe``, ``deleteWebhook``, ``getWebhookInfo``, long-poll ``getUpdates`` with offsets, limits,
  ``allowed_updates`` and 409 conflicts (Telegram's rule: a new ``getUpdates`` terminates the one in
  progress, which gets the 409; ``conflict_policy="reject_new"`` answers the newcomer instead);
* forum topics: ``createForumTopic``, ``editForumTopic``, ``closeForumTopic``, ``reopenForumTopic``,
  ``deleteForumTopic`` (``TOPIC_NAME_INVALID``, ``TOPIC_NOT_MODIFIED``, "message thread not found",
  also for the General topic ``message_thread_id=1``); a send into a closed topic is refused with
  ``TOPIC_CLOSED`` (``closed_topics_refuse_sends``);
* ``sendMessage``, ``sendDocument`` (multipart upload, bytes kept), ``sendChatAction``,
  ``deleteMessage``, ``getFile`` (``file is too big`` over the 20 MB bots may download) and
  ``/file/bot<token>/<path>`` downloads (``cut_file`` makes one break off after some bytes);
  ``setMessageReaction`` (recorded in ``reactions``; only
  emoji from :data:`ALLOWED_REACTIONS`, only on messages that exist);
* small stubs: ``getChat``, ``getChatMember`` (the bot is an admin with ``can_manage_topics`` unless
  ``bot_is_admin=False``), ``getForumTopicIconStickers``;
* command menus: ``setMyCommands``/``getMyCommands``/``deleteMyCommands``, kept per ``scope`` (and
  ``language_code``) as Telegram does; ``commands_for(scope)`` reads one, ``commands`` the default;
* user-side traffic for the bot to poll: ``push_message`` (text, documents, replies with a
  quote), ``push_media`` (photo, voice, audio, video, video note, animation, document; with size,
  duration and an album's ``media_group_id``), ``push_album``, ``push_edited_message``,
  ``push_topic_event`` (forum service messages), ``push_update`` (anything, even malformed). Every
  message the fake builds (the bot's and the users') is kept, so that a reply carries the
  replied-to message as Telegram does;
* inline keyboards: ``reply_markup`` is kept on each message the bot sent (``editMessageText``
  without one removes it, as Telegram does; ``editMessageReplyMarkup``), ``push_callback_query``
  queues an owner's (or a stranger's) press of a button on a message the bot sent, with that message
  as it is now, and ``answerCallbackQuery`` is recorded in ``callback_answers`` (one answer per
  query; an unknown or already answered query gets Telegram's "query is too old" error);
  ``redeliver`` puts an update back as Telegram does after a crash before the offset was confirmed;
* faults per method (``fail_next``, ``delay_next``, ``drop_next``, ``malformed_next``,
  ``result_false_next``) and a per-chat flood limiter answering 429 with ``retry_after``.

Message ids and thread ids share one counter per chat, as in Telegram (a topic's thread id is the id
of its ``forum_topic_created`` service message), starting at 2: id 1 is the General topic.

What it does not fake: webhooks, inline queries, sending media other than documents, entities
and ``parse_mode`` validation, per-user permissions beyond the bot's admin flag, multiple bots
(tokens are recorded but share one state), the General-topic methods, chat migration.
"""

from __future__ import annotations

import asyncio
import html.parser
import inspect
import json
import math
import re
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from tests.support.waiting import wait_until

JSON = dict[str, Any]

DEFAULT_FORUM_CHAT_ID = -1001234567890
DEFAULT_USER_ID = 424242
GENERAL_THREAD_ID = 1
FORUM_ICON_COLORS = (7322096, 16766590, 13338331, 9367192, 16749490, 16478047)
DEFAULT_ICON_COLOR = FORUM_ICON_COLORS[0]
MAX_TEXT_LENGTH = 4096
MAX_CAPTION_LENGTH = 1024
# What spends a group's allowance (docs/operations.md, "The outbound budget"): sends, edits, and topic create/edit/close/reopen/delete.
FLOOD_METHODS = frozenset({"sendMessage", "sendDocument", "sendPhoto", "editMessageText", "createForumTopic",
                           "editForumTopic", "closeForumTopic", "reopenForumTopic", "deleteForumTopic"})
CONFLICT = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
THREAD_NOT_FOUND = "Bad Request: message thread not found"
DOWNLOAD_LIMIT = 20 * 1024 * 1024  # getFile refuses bigger files ("file is too big")
ALLOWED_REACTIONS = frozenset({"👀", "👍", "👎", "❤", "🔥", "🎉", "✍", "👌", "🤔", "🙏"})  # a subset of Telegram's list
MEDIA_KINDS = ("photo", "voice", "audio", "video", "video_note", "animation", "document")
NOT_MODIFIED = "Bad Request: TOPIC_NOT_MODIFIED"
QUERY_TOO_OLD = "Bad Request: query is too old and response timeout expired or query ID is invalid"

_INT_PARAMS = frozenset({"chat_id", "message_thread_id", "offset", "limit", "user_id", "message_id",
                         "icon_color", "from_chat_id", "reply_to_message_id"})
_FLOAT_PARAMS = frozenset({"timeout"})
_STR_PARAMS = frozenset({"text", "name", "caption", "parse_mode", "action", "icon_custom_emoji_id",
                         "file_id", "title", "url", "secret_token", "callback_query_id"})
_DEFAULT_DESCRIPTIONS = {400: "Bad Request: injected failure", 401: "Unauthorized",
                         403: "Forbidden: bot was kicked from the supergroup chat", 404: "Not Found",
                         409: CONFLICT, 500: "Internal Server Error", 502: "Bad Gateway"}


@dataclass
class Call:
    """One HTTP request. ``status`` 0 = connection dropped by a fault, 499 = client went away."""

    method: str
    params: JSON
    status: int
    at: float
    token: str = ""


@dataclass
class SentMessage:
    chat_id: int
    thread_id: int | None
    text: str | None
    caption: str | None
    document_name: str | None
    document_bytes: bytes | None
    message_id: int | None
    kind: Literal["text", "document", "photo", "chat_action"]
    at: float
    deleted: bool = False
    entities: list[JSON] = field(default_factory=list)
    parse_mode: str | None = None
    silent: bool = False
    reply_markup: JSON | None = None
    edits: int = 0
    edited_at: float | None = None
    history: list[tuple[float, str]] = field(default_factory=list)  # (time, text) as first sent and after each edit


@dataclass
class CallbackAnswer:
    query_id: str
    text: str | None
    show_alert: bool
    at: float


@dataclass
class Reaction:
    chat_id: int
    message_id: int
    emoji: str | None  # None: the reaction was removed
    at: float


@dataclass
class Topic:
    chat_id: int
    thread_id: int
    name: str
    icon_color: int
    closed: bool = False
    deleted: bool = False
    created_at: float = field(default_factory=time.monotonic)
    icon_custom_emoji_id: str | None = None


@dataclass
class _Chat:
    id: int
    type: str
    title: str | None = None
    is_forum: bool = False


@dataclass
class _Fault:
    kind: Literal["fail", "delay", "drop", "malformed", "result_false"]
    times: int
    when: Callable[[JSON], bool] | None = None
    status: int = 400
    description: str = ""
    retry_after: int | None = None
    seconds: float = 0.0


@dataclass
class _Poll:
    request: web.Request
    terminated: bool = False


class ApiError(Exception):
    """Raised by method implementations; becomes ``{"ok": false, ...}`` with that HTTP status."""

    def __init__(self, status: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status, self.description, self.retry_after = status, description, retry_after

    def body(self) -> JSON:
        out: JSON = {"ok": False, "error_code": self.status, "description": self.description}
        if self.retry_after is not None:
            out["parameters"] = {"retry_after": self.retry_after}
        return out


class FakeBotApi:
    """In-process fake Bot API; see the module docstring. Use as ``async with FakeBotApi() as f``."""

    def __init__(self, forum_chat_id: int = DEFAULT_FORUM_CHAT_ID, *, bot_is_admin: bool = True,
                 conflict_policy: Literal["terminate_old", "reject_new"] = "terminate_old") -> None:
        self.forum_chat_id = forum_chat_id
        self.bot_is_admin = bot_is_admin
        # Telegram refuses a bot's messages in a closed topic (TOPIC_CLOSED) until it is reopened.
        self.closed_topics_refuse_sends = True
        self.conflict_policy = conflict_policy
        self.bot_user: JSON = {
            "id": 999000111, "is_bot": True, "first_name": "TopicBus",
            "username": "topicbus_test_bot", "can_join_groups": True,
            "can_read_all_group_messages": True, "supports_inline_queries": False,
            "has_topics_enabled": True,
        }
        self.port = 0
        self.tokens_seen: set[str] = set()
        self.calls: list[Call] = []
        self.sent: list[SentMessage] = []
        self.conflicts = 0
        self.get_updates_calls = 0
        self.flood_rejections = 0
        self._commands: dict[str, list[Any]] = {}
        self.reactions: list[Reaction] = []
        self.callback_answers: list[CallbackAnswer] = []
        self._queries: dict[str, bool] = {}  # callback query id -> answered
        self._messages: dict[tuple[int, int], JSON] = {}  # every message built, for replies
        self._file_sizes: dict[str, int] = {}  # declared sizes of files pushed without content
        self._served_bytes: dict[str, int] = {}  # files whose download serves only this many bytes
        self._chats: dict[int, _Chat] = {}
        self._topics: dict[tuple[int, int], Topic] = {}
        self._last_id: dict[int, int] = {}
        self._files: dict[str, tuple[str, bytes]] = {}
        self._file_cuts: dict[str, int] = {}  # file id -> bytes served before the connection drops
        self._file_holds: dict[str, asyncio.Event] = {}  # file id -> downloads wait until it is set
        self.file_requests: list[str] = []  # file ids whose download was asked for, in order
        self._updates: list[JSON] = []
        self._next_update_id = 1
        self._active_poll: _Poll | None = None
        self._faults: dict[str, list[_Fault]] = defaultdict(list)
        self._flood: tuple[int, int | None, float, float | None] | None = None
        self.keep_document_bytes = True  # False: record documents without their bytes (large floods)
        self._flood_log: dict[Any, deque[float]] = defaultdict(deque)
        self._changed = asyncio.Event()
        self._closed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._methods: dict[str, tuple[str, Callable[..., Any]]] = {}
        self.register_method("getUpdates", self._get_updates)  # called as (params, request)
        for name in ("getMe", "deleteWebhook", "getWebhookInfo", "createForumTopic",
                     "editForumTopic", "closeForumTopic", "reopenForumTopic", "deleteForumTopic",
                     "sendMessage", "sendChatAction", "sendDocument", "sendPhoto", "editMessageText",
                     "editMessageReplyMarkup", "deleteMessage", "getFile", "setMessageReaction", "getChat",
                     "getChatMember", "setMyCommands", "answerCallbackQuery",
                     "getMyCommands", "deleteMyCommands", "getForumTopicIconStickers"):
            self.register_method(name, getattr(self, "_m_" + name))
        self.add_forum(forum_chat_id)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._closed.clear()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_route("GET", "/file/bot{token}/{path:.+}", self._handle_file)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0,
                                     access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self._closed.set()
        self._pulse()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeBotApi:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot"

    @property
    def base_file_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/file/bot"

    def register_method(self, name: str, impl: Callable[[JSON], Any]) -> None:
        """Add or replace a method; ``impl(params)`` returns the result or raises ``ApiError``."""
        self._methods[name.lower()] = (name, impl)

    # ------------------------------------------------------------------ chats, topics, updates

    def add_forum(self, chat_id: int, title: str = "Forum", *, is_forum: bool = True) -> None:
        self._chats[chat_id] = _Chat(chat_id, "supergroup", title, is_forum)

    def push_message(self, chat_id: int, text: str | None, *, thread_id: int | None = None,
                     from_id: int = DEFAULT_USER_ID, first_name: str = "Owner",
                     is_bot: bool = False, document: JSON | None = None,
                     caption: str | None = None, reply_to_top: bool = True,
                     reply_to_message_id: int | None = None, quote: str | None = None,
                     extra: JSON | None = None) -> JSON:
        """Queue a ``message`` update from a user. ``document`` = {file_name, file_id[, content]}.
        ``reply_to_message_id``: a reply to that message (the bot's or a user's), with ``quote``
        as the quoted part; ``extra``: more message fields (media, ``media_group_id``…)."""
        content: JSON = dict(extra or {})
        if text is not None:
            content["text"] = text
            if text.startswith("/"):  # Telegram marks a leading command as a bot_command entity
                content["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
        if document is not None:
            data = document.get("content")
            doc = {"file_id": document["file_id"],
                   "file_unique_id": document.get("file_unique_id", "u" + document["file_id"]),
                   "file_name": document.get("file_name", "file.bin"),
                   "mime_type": document.get("mime_type", "application/octet-stream")}
            if isinstance(data, bytes):
                doc["file_size"] = len(data)
                self._files[doc["file_id"]] = (doc["file_name"], data)
            content["document"] = doc
        if caption is not None:
            content["caption"] = caption
        msg = self._build_message(chat_id, thread_id, self._user(from_id, first_name, is_bot),
                                  content)
        topic = self._topics.get((chat_id, thread_id or 0))
        if reply_to_message_id is not None:
            replied = self._messages.get((chat_id, reply_to_message_id))
            if replied is None:
                raise ValueError(f"no message {reply_to_message_id} in chat {chat_id} to reply to")
            msg["reply_to_message"] = {k: v for k, v in replied.items() if k != "reply_to_message"}
            if quote is not None:
                msg["quote"] = {"text": quote, "position": max(0, (replied.get("text") or "").find(quote))}
        elif reply_to_top and topic is not None:
            created = self._build_message(chat_id, topic.thread_id, msg["from"],
                                          {"forum_topic_created": self._topic_created(topic)},
                                          message_id=topic.thread_id)
            msg["reply_to_message"] = created
        return self._enqueue("message", msg)

    def push_edited_message(self, chat_id: int, message_id: int, text: str | None, *,
                            thread_id: int | None = None, from_id: int = DEFAULT_USER_ID,
                            first_name: str = "Owner", caption: str | None = None) -> JSON:
        """Queue an ``edited_message`` update: the message's new text (or, for media, caption)."""
        content: JSON = {"edit_date": int(time.time())}
        if text is not None:
            content["text"] = text
        if caption is not None:
            content["caption"] = caption
        msg = self._build_message(chat_id, thread_id, self._user(from_id, first_name, False),
                                  content, message_id=message_id)
        return self._enqueue("edited_message", msg)

    def push_media(self, chat_id: int, kind: str, *, thread_id: int | None = None, content: bytes | None = None,
                   size: int | None = None, duration: int = 3, file_name: str | None = None,
                   mime_type: str | None = None, caption: str | None = None, media_group_id: str | None = None,
                   file_id: str | None = None, from_id: int = DEFAULT_USER_ID,
                   reply_to_message_id: int | None = None, cut_at: int | None = None) -> JSON:
        """Queue a user's media message (``kind`` in :data:`MEDIA_KINDS`) as Telegram shapes it.
        ``content``: the bytes ``getFile`` serves; ``size`` alone declares a file the fake does not
        hold (over 20 MB ``getFile`` answers "file is too big", as Telegram does). ``cut_at``: the
        file download serves only the first ``cut_at`` bytes of ``content``, as a complete answer,
        while the message and ``getFile`` report the whole size (a file served short)."""
        if kind not in MEDIA_KINDS:
            raise ValueError(f"unknown media kind {kind!r}")
        file_id = file_id or f"{kind}-{chat_id}-{self._next_update_id}-{len(self._files) + len(self._file_sizes)}"
        file_size = len(content) if content is not None else size
        if content is not None:
            self._files[file_id] = (file_name or f"{kind}.bin", content)
            if cut_at is not None:
                self._served_bytes[file_id] = cut_at
        elif size is not None:
            self._file_sizes[file_id] = size
        ref: JSON = {"file_id": file_id, "file_unique_id": "u" + file_id}
        if file_size is not None:
            ref["file_size"] = file_size
        fields: JSON = {}
        if kind == "photo":
            fields["photo"] = [{**ref, "file_id": file_id + "-thumb", "file_unique_id": "ut" + file_id,
                                "width": 90, "height": 60, "file_size": 1000},
                               {**ref, "width": 1280, "height": 853}]
        elif kind == "voice":
            fields["voice"] = {**ref, "duration": duration, "mime_type": mime_type or "audio/ogg"}
        elif kind == "audio":
            fields["audio"] = {**ref, "duration": duration, "mime_type": mime_type or "audio/mpeg",
                               "file_name": file_name or "song.mp3", "title": "Song", "performer": "Band"}
        elif kind == "video":
            fields["video"] = {**ref, "duration": duration, "width": 640, "height": 360,
                               "mime_type": mime_type or "video/mp4", "file_name": file_name or "clip.mp4"}
        elif kind == "video_note":
            fields["video_note"] = {**ref, "duration": duration, "length": 240}
        elif kind == "animation":
            animation = {**ref, "duration": duration, "width": 320, "height": 240,
                         "mime_type": mime_type or "video/mp4", "file_name": file_name or "funny.gif.mp4"}
            fields["animation"] = animation  # Telegram sends an animation as a document too
            fields["document"] = {k: animation[k] for k in ("file_id", "file_unique_id", "file_name", "mime_type")
                                  if k in animation}
        else:
            fields["document"] = {**ref, "file_name": file_name or "file.bin",
                                  "mime_type": mime_type or "application/octet-stream"}
        if media_group_id is not None:
            fields["media_group_id"] = media_group_id
        return self.push_message(chat_id, None, thread_id=thread_id, from_id=from_id, caption=caption, extra=fields,
                                 reply_to_message_id=reply_to_message_id)

    def push_album(self, chat_id: int, parts: list[tuple[str, bytes]], *, thread_id: int | None = None,
                   caption: str | None = None, media_group_id: str | None = None) -> list[JSON]:
        """Queue an album: one message per ``(kind, content)`` part sharing a ``media_group_id``,
        the caption on the first part (as Telegram clients send it)."""
        group = media_group_id or f"album-{self._next_update_id}"
        return [self.push_media(chat_id, kind, thread_id=thread_id, content=data, media_group_id=group,
                                caption=caption if i == 0 else None, file_name=f"part{i}.{kind}")
                for i, (kind, data) in enumerate(parts)]

    def push_callback_query(self, chat_id: int, message_id: int, data: str, *, from_id: int = DEFAULT_USER_ID,
                            first_name: str = "Owner", is_bot: bool = False) -> JSON:
        """Queue a ``callback_query`` update: a user pressed the button with ``data`` under the bot's
        message ``message_id``. The query carries that message as it reads now (text, entities,
        keyboard, its topic), as Telegram sends it."""
        sent = next((m for m in self.sent if m.chat_id == chat_id and m.message_id == message_id and not m.deleted),
                    None)
        if sent is None:
            raise ValueError(f"the bot sent no message {message_id} in chat {chat_id}")
        content: JSON = {}
        if sent.kind == "text":
            content["text"] = sent.text or ""
            if sent.entities:
                content["entities"] = sent.entities
        else:
            content["document"] = {"file_id": f"doc-{chat_id}-{message_id}", "file_unique_id": f"u{message_id}",
                                   "file_name": sent.document_name or "document"}
            if sent.caption is not None:
                content["caption"] = sent.caption
        if sent.reply_markup:
            content["reply_markup"] = sent.reply_markup
        message = self._build_message(chat_id, sent.thread_id, self._bot_from(), content, message_id)
        query_id = f"{from_id}-{self._next_update_id}"
        self._queries[query_id] = False
        return self._enqueue("callback_query", {"id": query_id, "from": self._user(from_id, first_name, is_bot),
                                                "chat_instance": f"ci{chat_id}", "data": data, "message": message})

    def redeliver(self, update: JSON) -> None:
        """Put an update back in the queue with its own ``update_id``, as Telegram does when the bot
        stopped before confirming it (a getUpdates with a higher offset drops it again)."""
        self._updates = sorted([*(u for u in self._updates if u["update_id"] != update["update_id"]), update],
                               key=lambda u: u["update_id"])
        self._pulse()

    def clear_faults(self, method: str) -> None:
        """Forget the faults still queued for ``method``."""
        self._faults.pop(method.lower(), None)

    def answers_to(self, update: JSON) -> list[CallbackAnswer]:
        """What the bot answered to the callback query of ``update``."""
        query_id = update["callback_query"]["id"]
        return [a for a in self.callback_answers if a.query_id == query_id]

    def message(self, chat_id: int, message_id: int) -> JSON | None:
        """A message the fake built (the bot's or a user's)."""
        return self._messages.get((chat_id, message_id))

    def reactions_on(self, chat_id: int, message_id: int) -> list[str | None]:
        return [r.emoji for r in self.reactions if r.chat_id == chat_id and r.message_id == message_id]

    def push_topic_event(self, chat_id: int, thread_id: int | None,
                         event: Literal["created", "closed", "reopened", "edited"],
                         name: str | None = None, *, from_id: int = DEFAULT_USER_ID,
                         icon_custom_emoji_id: str | None = None) -> JSON:
        """Queue a forum service message from a user and apply it to the topic state.

        ``created`` with ``thread_id=None`` allocates a new thread id (a user-made topic)."""
        sender = self._user(from_id, "Owner", False)
        if event == "created":
            topic = self._topics.get((chat_id, thread_id or 0))
            if topic is None:
                if thread_id is None:
                    thread_id = self._alloc_id(chat_id)
                self._last_id[chat_id] = max(self._last_id.get(chat_id, 1), thread_id)
                topic = Topic(chat_id, thread_id, name or f"Topic {thread_id}", DEFAULT_ICON_COLOR)
                self._topics[(chat_id, thread_id)] = topic
            msg = self._build_message(chat_id, topic.thread_id, sender,
                                      {"forum_topic_created": self._topic_created(topic)},
                                      message_id=topic.thread_id)
            return self._enqueue("message", msg)
        assert thread_id is not None, "thread_id is required for closed/reopened/edited"
        topic = self._topics[(chat_id, thread_id)]
        payload: JSON = {}
        if event == "closed":
            topic.closed = True
        elif event == "reopened":
            topic.closed = False
        elif event == "edited":
            if name is not None:
                topic.name = payload["name"] = name
            if icon_custom_emoji_id is not None:
                topic.icon_custom_emoji_id = icon_custom_emoji_id or None
                payload["icon_custom_emoji_id"] = icon_custom_emoji_id
        else:
            raise ValueError(f"unknown topic event {event!r}")
        msg = self._build_message(chat_id, thread_id, sender, {f"forum_topic_{event}": payload})
        return self._enqueue("message", msg)

    def user_delete_topic(self, chat_id: int, thread_id: int) -> None:
        """A user deletes a topic; Telegram sends no update for that."""
        self._topics[(chat_id, thread_id)].deleted = True
        self._pulse()

    def push_update(self, raw: JSON) -> JSON:
        """Queue an arbitrary (possibly malformed) update; its ``update_id`` is always assigned."""
        update = {**raw, "update_id": self._next_update_id}
        self._next_update_id += 1
        self._updates.append(update)
        self._pulse()
        return update

    # ------------------------------------------------------------------ faults

    def fail_next(self, method: str, *, status: int = 400, description: str | None = None,
                  retry_after: int | None = None, times: int = 1,
                  when: Callable[[JSON], bool] | None = None) -> None:
        """The next ``times`` matching calls answer with an error (429 gets ``retry_after``)."""
        if status == 429 and retry_after is None:
            retry_after = 1
        if description is None:
            description = (f"Too Many Requests: retry after {retry_after}" if status == 429
                           else _DEFAULT_DESCRIPTIONS.get(status, f"Error {status}"))
        self._add_fault(method, _Fault("fail", times, when, status, description, retry_after))

    def delay_next(self, method: str, seconds: float, times: int = 1,
                   when: Callable[[JSON], bool] | None = None) -> None:
        """The call is executed (its effect happens), then the response is held for ``seconds``:
        like Telegram, a timed-out request may still have been applied."""
        self._add_fault(method, _Fault("delay", times, when, seconds=seconds))

    def drop_next(self, method: str, times: int = 1,
                  when: Callable[[JSON], bool] | None = None) -> None:
        """Close the connection without a response (the call has no effect)."""
        self._add_fault(method, _Fault("drop", times, when))

    def malformed_next(self, method: str, times: int = 1) -> None:
        """Answer 200 with a body that is not JSON (the call has no effect)."""
        self._add_fault(method, _Fault("malformed", times))

    def result_false_next(self, method: str, times: int = 1) -> None:
        """Answer 200 ``{"ok": true, "result": false}`` (the call has no effect)."""
        self._add_fault(method, _Fault("result_false", times))

    def set_flood_limit(self, per_chat_per_minute: int | None, retry_after: int | None = None, *,
                        window_s: float = 60.0, per_second: float | None = None) -> None:
        """Telegram's allowance per chat: ``per_chat_per_minute`` calls (sends, edits, topic operations)
        in a sliding ``window_s`` (compress time by shortening it), and at most ``per_second`` a
        second. Beyond it: 429 with ``retry_after`` (default: until the window allows one more)."""
        self._flood = None if per_chat_per_minute is None else (per_chat_per_minute, retry_after, window_s,
                                                                  per_second)
        self._flood_log.clear()

    def _add_fault(self, method: str, fault: _Fault) -> None:
        self._faults[method.lower()].append(fault)

    def _take_fault(self, method: str, params: JSON) -> _Fault | None:
        queue = self._faults.get(method.lower(), [])
        for fault in queue:
            try:
                matches = fault.when is None or bool(fault.when(params))
            except Exception:  # a predicate that cannot handle these params does not match
                matches = False
            if matches:
                fault.times -= 1
                if fault.times <= 0:
                    queue.remove(fault)
                return fault
        return None

    # ------------------------------------------------------------------ observability

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method.lower() == method.lower()]

    def reset_calls(self) -> None:
        self.calls.clear()

    def topics(self, chat_id: int | None = None) -> list[Topic]:
        return [t for t in self._topics.values() if chat_id is None or t.chat_id == chat_id]

    def topic(self, chat_id: int, thread_id: int) -> Topic | None:
        return self._topics.get((chat_id, thread_id))

    def messages_in(self, chat_id: int, thread_id: int | None) -> list[SentMessage]:
        """Messages and documents the bot sent into that topic (``None`` = General/no topic)."""
        return [m for m in self.sent if m.chat_id == chat_id and m.thread_id == thread_id
                and m.kind != "chat_action"]

    def visible_lines(self, chat_id: int, thread_id: int | None, *, files: bool = True,
                      pings: bool = False) -> list[str]:
        """The topic as a phone shows it, line by line: texts as last edited, the lines of text files
        (``files``), and — unless ``pings`` — without the one-line "✓ …" that ends a silent stream."""
        lines: list[str] = []
        for message in self.messages_in(chat_id, thread_id):
            if message.deleted:
                continue
            if message.kind == "text" and message.text is not None:
                if not pings and message.text.startswith("✓"):
                    continue
                lines += message.text.split("\n")
            elif message.kind == "document" and files and message.document_bytes is not None:
                lines += message.document_bytes.decode("utf-8", "replace").split("\n")
        return lines

    def pending_updates(self) -> list[JSON]:
        """Updates not yet confirmed by a ``getUpdates`` offset."""
        return list(self._updates)

    def summary(self) -> str:
        topics = ", ".join(f"{t.thread_id}:{t.name!r}{' closed' if t.closed else ''}"
                           f"{' deleted' if t.deleted else ''}" for t in self._topics.values())
        last = ", ".join(f"{c.method}->{c.status}" for c in self.calls[-8:])
        return (f"topics=[{topics}] sent={len(self.sent)} pending_updates={len(self._updates)} "
                f"calls={len(self.calls)} last=[{last}]")

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0,
                       message: str = "") -> Any:
        """Wait until ``predicate()`` is truthy and return its value; on timeout raise
        ``AssertionError`` with a summary of the fake's state (``tests.support.waiting``)."""
        return await wait_until(predicate, timeout=timeout, message=message or "condition",
                                describe=lambda: f"fake: {self.summary()}")

    # ------------------------------------------------------------------ HTTP plumbing

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._closed.wait(), seconds)
        except TimeoutError:
            pass

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        token, name = request.match_info["token"], request.match_info["method"]
        self.tokens_seen.add(token)
        method, impl = self._methods.get(name.lower(), (name, None))
        call = Call(method, {}, 0, time.monotonic(), token)
        self.calls.append(call)
        fault: _Fault | None = None
        try:
            call.params = params = await self._parse(request)
            fault = self._take_fault(method, params)
            if fault is not None and fault.kind == "drop":
                call.status = 0
                self._pulse()
                if request.transport is not None:
                    request.transport.abort()  # aiohttp ignores the failed write of this response
                return web.Response(status=500)
            if fault is not None and fault.kind == "malformed":
                call.status = 200
                self._pulse()
                return web.Response(status=200, text="<html>upstream hiccup</html>",
                                    content_type="text/html")
            if fault is not None and fault.kind == "fail":
                raise ApiError(fault.status, fault.description, fault.retry_after)
            if fault is not None and fault.kind == "result_false":
                result: Any = False
            elif impl is None:
                raise ApiError(404, "Not Found")
            else:
                self._check_flood(method, params)
                result = impl(params, request) if method == "getUpdates" else impl(params)
                if inspect.isawaitable(result):
                    result = await result
                self._record_flood(method, params)
            status, body = 200, {"ok": True, "result": result}
        except ApiError as exc:
            status, body = exc.status, exc.body()
        except asyncio.CancelledError:  # the client went away (handler_cancellation=True)
            call.status = 499
            self._pulse()
            raise
        call.status = status
        self._pulse()
        if fault is not None and fault.kind == "delay":
            await self._sleep(fault.seconds)
        return web.json_response(body, status=status)

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        self.tokens_seen.add(request.match_info["token"])
        file_id = request.match_info["path"].rsplit("/", 1)[-1]
        if file_id not in self._files:
            return web.Response(status=404, text="Not Found")
        self.file_requests.append(file_id)
        if (hold := self._file_holds.get(file_id)) is not None:
            await hold.wait()
        data = self._files[file_id][1]
        data = data[:self._served_bytes.get(file_id, len(data))]
        if (cut := self._file_cuts.get(file_id)) is None:
            return web.Response(body=data, content_type="application/octet-stream")
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data[:cut])
        if request.transport is not None:
            request.transport.abort()
        return response

    def hold_file(self, file_id: str) -> asyncio.Event:
        """Downloads of this file wait until the returned event is set."""
        return self._file_holds.setdefault(file_id, asyncio.Event())

    def cut_file(self, file_id: str, after_bytes: int) -> None:
        """Downloads of this file announce its whole size but break off after ``after_bytes``."""
        self._file_cuts[file_id] = after_bytes

    async def _parse(self, request: web.Request) -> JSON:
        raw: dict[str, Any] = dict(request.query)
        files: dict[str, web.FileField] = {}
        if request.can_read_body:
            if request.content_type == "application/json":
                try:
                    body = await request.json()
                except ValueError:
                    body = None
                if not isinstance(body, dict):
                    raise ApiError(400, "Bad Request: can't parse JSON object")
                raw.update(body)
            else:
                for key, value in (await request.post()).items():
                    if isinstance(value, web.FileField):
                        files[key] = value
                    else:
                        raw[key] = value
        params = {key: _coerce(key, value) for key, value in raw.items()}
        for key, value in list(params.items()):
            if isinstance(value, str) and value.startswith("attach://"):
                params[key] = files.pop(value.removeprefix("attach://"), value)
        params.update(files)
        return params

    def _check_flood(self, method: str, params: JSON) -> None:
        if self._flood is None or method not in FLOOD_METHODS:
            return
        window = self._flood_log[params.get("chat_id")]
        now = time.monotonic()
        limit, retry_after, window_s, per_second = self._flood
        while window and window[0] <= now - window_s:
            window.popleft()
        wait = 0.0
        if len(window) >= limit:
            wait = window[len(window) - limit] + window_s - now
        if per_second and window and now - window[-1] < 1.0 / per_second:
            wait = max(wait, window[-1] + 1.0 / per_second - now)
        if wait > 0:
            self.flood_rejections += 1
            seconds = retry_after if retry_after is not None else max(1, math.ceil(wait))
            raise ApiError(429, f"Too Many Requests: retry after {seconds}", seconds)

    def _record_flood(self, method: str, params: JSON) -> None:
        if self._flood is not None and method in FLOOD_METHODS:
            self._flood_log[params.get("chat_id")].append(time.monotonic())

    # ------------------------------------------------------------------ state helpers

    def _chat(self, params: JSON) -> _Chat:
        chat_id = params.get("chat_id")
        if chat_id is None or chat_id == "":
            raise ApiError(400, "Bad Request: chat_id is empty")
        if isinstance(chat_id, int) and chat_id > 0:
            return self._chats.setdefault(chat_id, _Chat(chat_id, "private"))
        if isinstance(chat_id, int) and chat_id in self._chats:
            return self._chats[chat_id]
        raise ApiError(400, "Bad Request: chat not found")

    def _live_topic(self, chat: _Chat, thread_id: Any) -> Topic:
        topic = self._topics.get((chat.id, thread_id)) if isinstance(thread_id, int) else None
        if topic is None or topic.deleted:
            raise ApiError(400, THREAD_NOT_FOUND)
        return topic

    def _send_target(self, params: JSON) -> tuple[_Chat, int | None]:
        chat = self._chat(params)
        thread_id = params.get("message_thread_id")
        if thread_id is None:
            return chat, None
        topic = self._live_topic(chat, thread_id)
        if topic.closed and (self.closed_topics_refuse_sends or not self.bot_is_admin):
            raise ApiError(400, "Bad Request: TOPIC_CLOSED")
        return chat, topic.thread_id

    def _alloc_id(self, chat_id: int) -> int:
        self._last_id[chat_id] = self._last_id.get(chat_id, 1) + 1
        return self._last_id[chat_id]

    def _chat_dict(self, chat_id: int) -> JSON:
        chat = self._chats.get(chat_id) or _Chat(chat_id, "private" if chat_id > 0 else "supergroup",
                                                  None if chat_id > 0 else f"Chat {chat_id}")
        if chat.type == "private":
            return {"id": chat.id, "type": "private", "first_name": f"User{chat.id}"}
        out: JSON = {"id": chat.id, "type": chat.type, "title": chat.title}
        if chat.is_forum:
            out["is_forum"] = True
        return out

    def _bot_from(self) -> JSON:
        return {k: self.bot_user[k] for k in ("id", "is_bot", "first_name", "username")}

    @staticmethod
    def _user(user_id: int, first_name: str, is_bot: bool) -> JSON:
        return {"id": user_id, "is_bot": is_bot, "first_name": first_name}

    @staticmethod
    def _topic_created(topic: Topic) -> JSON:
        out: JSON = {"name": topic.name, "icon_color": topic.icon_color}
        if topic.icon_custom_emoji_id:
            out["icon_custom_emoji_id"] = topic.icon_custom_emoji_id
        return out

    def _build_message(self, chat_id: int, thread_id: int | None, sender: JSON, content: JSON,
                       message_id: int | None = None) -> JSON:
        msg: JSON = {"message_id": message_id if message_id is not None else self._alloc_id(chat_id),
                     "date": int(time.time()), "chat": self._chat_dict(chat_id), "from": sender}
        if thread_id is not None:
            msg["message_thread_id"] = thread_id
            msg["is_topic_message"] = True
        msg.update(content)
        self._messages[(chat_id, msg["message_id"])] = msg
        return msg

    def _enqueue(self, kind: str, payload: JSON) -> JSON:
        return self.push_update({kind: payload})

    def _record(self, chat_id: int, thread_id: int | None, kind: Any, **fields: Any) -> None:
        entry = {"text": None, "caption": None, "document_name": None, "document_bytes": None,
                 "message_id": None, **fields}
        now = time.monotonic()
        message = SentMessage(chat_id, thread_id, kind=kind, at=now, **entry)
        message.history.append((now, message.text or message.caption or ""))
        self.sent.append(message)

    # ------------------------------------------------------------------ Bot API methods

    def _m_getMe(self, p: JSON) -> JSON:
        return dict(self.bot_user)

    def _m_deleteWebhook(self, p: JSON) -> bool:
        if p.get("drop_pending_updates"):
            self._updates.clear()
        return True

    def _m_getWebhookInfo(self, p: JSON) -> JSON:
        return {"url": "", "has_custom_certificate": False,
                "pending_update_count": len(self._updates)}

    async def _get_updates(self, p: JSON, request: web.Request) -> list[JSON]:
        self.get_updates_calls += 1
        offset, timeout = p.get("offset"), max(0.0, float(p.get("timeout") or 0))
        limit = min(max(int(p.get("limit") or 100), 1), 100)
        allowed = set(p["allowed_updates"]) if isinstance(p.get("allowed_updates"), list) else set()
        old = self._active_poll
        if old is not None and not old.terminated:
            transport = old.request.transport
            old_alive = transport is not None and not transport.is_closing()
            if self.conflict_policy == "reject_new" and old_alive:
                self.conflicts += 1
                raise ApiError(409, CONFLICT)
            if old_alive:
                self.conflicts += 1
            old.terminated = True
        poll = self._active_poll = _Poll(request)
        try:
            if isinstance(offset, int) and offset < 0:
                del self._updates[:offset]
            elif isinstance(offset, int):
                self._updates = [u for u in self._updates if u["update_id"] >= offset]
            if allowed:
                self._updates = [u for u in self._updates if allowed & (u.keys() - {"update_id"})]
            deadline = time.monotonic() + timeout
            while True:
                changed = self._changed
                if poll.terminated:
                    raise ApiError(409, CONFLICT)
                batch = [u for u in self._updates
                         if not allowed or allowed & (u.keys() - {"update_id"})][:limit]
                remaining = deadline - time.monotonic()
                if batch or remaining <= 0 or self._closed.is_set():
                    return batch
                try:
                    await asyncio.wait_for(changed.wait(), remaining)
                except TimeoutError:
                    pass
        finally:
            if self._active_poll is poll:
                self._active_poll = None

    def _m_createForumTopic(self, p: JSON) -> JSON:
        chat = self._chat(p)
        if chat.type != "private" and not chat.is_forum:
            raise ApiError(400, "Bad Request: the chat is not a forum")
        if not self.bot_is_admin:
            raise ApiError(400, "Bad Request: not enough rights to create a topic")
        name = p.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= 128:
            raise ApiError(400, "Bad Request: TOPIC_NAME_INVALID")
        color = p.get("icon_color", DEFAULT_ICON_COLOR)
        if color not in FORUM_ICON_COLORS:
            raise ApiError(400, "Bad Request: TOPIC_ICON_COLOR_INVALID")
        topic = Topic(chat.id, self._alloc_id(chat.id), name, color,
                      icon_custom_emoji_id=p.get("icon_custom_emoji_id") or None)
        self._topics[(chat.id, topic.thread_id)] = topic
        return {"message_thread_id": topic.thread_id, **self._topic_created(topic)}

    def _managed_topic(self, p: JSON) -> Topic:
        chat = self._chat(p)
        if not self.bot_is_admin:
            raise ApiError(400, "Bad Request: not enough rights to manage topics")
        return self._live_topic(chat, p.get("message_thread_id"))

    def _m_editForumTopic(self, p: JSON) -> bool:
        topic = self._managed_topic(p)
        name, emoji = p.get("name") or None, p.get("icon_custom_emoji_id")
        if name is not None and (not isinstance(name, str) or len(name) > 128):
            raise ApiError(400, "Bad Request: TOPIC_NAME_INVALID")
        new_name = name if name is not None else topic.name
        new_emoji = topic.icon_custom_emoji_id if emoji is None else (emoji or None)
        if (new_name, new_emoji) == (topic.name, topic.icon_custom_emoji_id):
            raise ApiError(400, NOT_MODIFIED)
        topic.name, topic.icon_custom_emoji_id = new_name, new_emoji
        return True

    def _m_closeForumTopic(self, p: JSON) -> bool:
        topic = self._managed_topic(p)
        if topic.closed:
            raise ApiError(400, NOT_MODIFIED)
        topic.closed = True
        return True

    def _m_reopenForumTopic(self, p: JSON) -> bool:
        topic = self._managed_topic(p)
        if not topic.closed:
            raise ApiError(400, NOT_MODIFIED)
        topic.closed = False
        return True

    def _m_deleteForumTopic(self, p: JSON) -> bool:
        self._managed_topic(p).deleted = True
        return True

    def _m_sendMessage(self, p: JSON) -> JSON:
        chat, thread_id = self._send_target(p)
        text = self._checked_text(p)
        msg = self._build_message(chat.id, thread_id, self._bot_from(), {"text": text})
        self._record(chat.id, thread_id, "text", text=text, message_id=msg["message_id"], **self._looks(p))
        return msg

    def _checked_text(self, p: JSON) -> str:
        text = p.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if len(text.encode("utf-16-le")) // 2 > MAX_TEXT_LENGTH:
            raise ApiError(400, "Bad Request: message is too long")
        if p.get("parse_mode") == "HTML" and not _balanced_html(text):
            raise ApiError(400, "Bad Request: can't parse entities: unexpected end tag")
        return text

    @staticmethod
    def _looks(p: JSON) -> dict[str, Any]:
        markup = p.get("reply_markup")
        return {"entities": list(p.get("entities") or []), "parse_mode": p.get("parse_mode"),
                "silent": bool(p.get("disable_notification")), "reply_markup": markup or None}

    def _m_editMessageText(self, p: JSON) -> JSON:
        chat = self._chat(p)
        message = next((m for m in self.sent if m.chat_id == chat.id and m.message_id == p.get("message_id")
                        and not m.deleted and m.kind == "text"), None)
        topic = self._topics.get((chat.id, message.thread_id)) if message and message.thread_id else None
        if message is None or (topic is not None and topic.deleted):  # a deleted topic takes its messages
            raise ApiError(400, "Bad Request: message to edit not found")
        text = self._checked_text(p)
        looks = self._looks(p)
        if text == message.text and looks["entities"] == message.entities and looks["reply_markup"] == message.reply_markup:
            raise ApiError(400, "Bad Request: message is not modified: specified new message content and reply "
                                "markup are exactly the same as a current content and reply markup of the message")
        message.text, message.entities, message.parse_mode = text, looks["entities"], looks["parse_mode"]
        message.reply_markup = looks["reply_markup"]
        message.edits += 1
        message.edited_at = time.monotonic()
        message.history.append((message.edited_at, text))
        return self._build_message(chat.id, message.thread_id, self._bot_from(), {"text": text}, message.message_id)

    def _m_editMessageReplyMarkup(self, p: JSON) -> JSON:
        chat = self._chat(p)
        message = next((m for m in self.sent if m.chat_id == chat.id and m.message_id == p.get("message_id")
                        and not m.deleted), None)
        if message is None:
            raise ApiError(400, "Bad Request: message to edit not found")
        markup = p.get("reply_markup") or None
        if markup == message.reply_markup:
            raise ApiError(400, "Bad Request: message is not modified")
        message.reply_markup = markup
        return self._build_message(chat.id, message.thread_id, self._bot_from(), {"text": message.text or ""},
                                   message.message_id)

    def _m_sendChatAction(self, p: JSON) -> bool:
        chat, thread_id = self._send_target(p)
        if not p.get("action"):
            raise ApiError(400, "Bad Request: wrong parameter action in request")
        self._record(chat.id, thread_id, "chat_action", text=p["action"])
        return True

    def _m_sendDocument(self, p: JSON) -> JSON:
        chat, thread_id = self._send_target(p)
        caption, document = p.get("caption"), p.get("document")
        if caption is not None and len(caption) > MAX_CAPTION_LENGTH:
            raise ApiError(400, "Bad Request: message caption is too long")
        if isinstance(document, web.FileField):
            data, file_name = document.file.read(), document.filename or "document"
            if not data:
                raise ApiError(400, "Bad Request: file must be non-empty")
        elif isinstance(document, str) and document in self._files:
            file_name, data = self._files[document]
        else:
            raise ApiError(400, "Bad Request: wrong file identifier/HTTP URL specified")
        message_id = self._alloc_id(chat.id)
        file_id = f"doc-{chat.id}-{message_id}"
        self._files[file_id] = (file_name, data if self.keep_document_bytes else b"")
        content: JSON = {"document": {"file_id": file_id, "file_unique_id": f"u{file_id}",
                                      "file_name": file_name, "file_size": len(data)}}
        if caption is not None:
            content["caption"] = caption
        msg = self._build_message(chat.id, thread_id, self._bot_from(), content, message_id)
        self._record(chat.id, thread_id, "document", caption=caption, document_name=file_name,
                     document_bytes=data if self.keep_document_bytes else None, message_id=message_id, silent=bool(p.get("disable_notification")),
                     entities=list(p.get("caption_entities") or []))
        return msg

    def _m_sendPhoto(self, p: JSON) -> JSON:
        chat, thread_id = self._send_target(p)
        caption, photo = p.get("caption"), p.get("photo")
        if caption is not None and len(caption) > MAX_CAPTION_LENGTH:
            raise ApiError(400, "Bad Request: message caption is too long")
        if not isinstance(photo, web.FileField):
            raise ApiError(400, "Bad Request: wrong file identifier/HTTP URL specified")
        data = photo.file.read()
        if not data.startswith((b"\x89PNG", b"\xff\xd8", b"RIFF")):
            raise ApiError(400, "Bad Request: IMAGE_PROCESS_FAILED")
        message_id = self._alloc_id(chat.id)
        file_id = f"photo-{chat.id}-{message_id}"
        self._files[file_id] = (photo.filename or "photo", data)
        content: JSON = {"photo": [{"file_id": file_id, "file_unique_id": f"u{file_id}", "width": 1, "height": 1,
                                    "file_size": len(data)}]}
        if caption is not None:
            content["caption"] = caption
        msg = self._build_message(chat.id, thread_id, self._bot_from(), content, message_id)
        self._record(chat.id, thread_id, "photo", caption=caption, document_name=photo.filename,
                     document_bytes=data, message_id=message_id, silent=bool(p.get("disable_notification")))
        return msg

    def _m_deleteMessage(self, p: JSON) -> bool:
        chat = self._chat(p)
        for m in self.sent:
            if m.chat_id == chat.id and m.message_id == p.get("message_id") and not m.deleted:
                m.deleted = True
                return True
        raise ApiError(400, "Bad Request: message to delete not found")

    def _m_getFile(self, p: JSON) -> JSON:
        file_id = p.get("file_id")
        declared = self._file_sizes.get(file_id) if isinstance(file_id, str) else None
        if declared is not None and declared > DOWNLOAD_LIMIT or (
                file_id in self._files and len(self._files[file_id][1]) > DOWNLOAD_LIMIT):
            raise ApiError(400, "Bad Request: file is too big")
        if file_id not in self._files:
            raise ApiError(400, "Bad Request: invalid file_id")
        return {"file_id": file_id, "file_unique_id": f"u{file_id}",
                "file_size": len(self._files[file_id][1]), "file_path": f"documents/{file_id}"}

    def _m_setMessageReaction(self, p: JSON) -> bool:
        chat = self._chat(p)
        message_id = p.get("message_id")
        if (chat.id, message_id) not in self._messages:
            raise ApiError(400, "Bad Request: message to react not found")
        reaction = p.get("reaction") or []
        if not isinstance(reaction, list) or len(reaction) > 1:
            raise ApiError(400, "Bad Request: REACTIONS_TOO_MANY")
        emoji = None
        if reaction:
            kind = reaction[0]
            if not isinstance(kind, dict) or kind.get("type") != "emoji" or kind.get("emoji") not in ALLOWED_REACTIONS:
                raise ApiError(400, "Bad Request: REACTION_INVALID")
            emoji = kind["emoji"]
        self.reactions.append(Reaction(chat.id, message_id, emoji, time.monotonic()))
        return True

    def _m_answerCallbackQuery(self, p: JSON) -> bool:
        query_id = p.get("callback_query_id")
        text = p.get("text")
        if text is not None and len(text) > 200:
            raise ApiError(400, "Bad Request: MESSAGE_TOO_LONG")
        if query_id not in self._queries or self._queries[query_id]:
            raise ApiError(400, QUERY_TOO_OLD)
        self._queries[query_id] = True
        self.callback_answers.append(CallbackAnswer(query_id, text, bool(p.get("show_alert")), time.monotonic()))
        return True

    def _m_getChat(self, p: JSON) -> JSON:
        chat = self._chat(p)
        gifts = dict.fromkeys(("unlimited_gifts", "limited_gifts", "unique_gifts",
                               "premium_subscription", "gifts_from_channels"), False)
        return {**self._chat_dict(chat.id), "accent_color_id": 0, "max_reaction_count": 11,
                "accepted_gift_types": gifts}

    def _m_getChatMember(self, p: JSON) -> JSON:
        self._chat(p)
        user_id = p.get("user_id")
        if user_id != self.bot_user["id"]:
            return {"status": "member", "user": self._user(user_id, "User", False)}
        if not self.bot_is_admin:
            return {"status": "member", "user": dict(self.bot_user)}
        rights = dict.fromkeys(("can_manage_chat", "can_delete_messages", "can_manage_video_chats",
                                "can_restrict_members", "can_change_info", "can_invite_users",
                                "can_pin_messages", "can_manage_topics"), True)
        rights.update(dict.fromkeys(("can_be_edited", "is_anonymous", "can_promote_members",
                                     "can_post_stories", "can_edit_stories",
                                     "can_delete_stories"), False))
        return {"status": "administrator", "user": self._bot_from(), **rights}

    @staticmethod
    def _scope_key(scope: Any, language_code: Any = None) -> str:
        scope = scope if isinstance(scope, dict) and scope.get("type") not in (None, "default") else None
        return json.dumps([scope, language_code or ""], sort_keys=True)

    @property
    def commands(self) -> list[Any]:
        """The default scope's menu."""
        return self.commands_for(None)

    def commands_for(self, scope: JSON | None, language_code: str | None = None) -> list[Any]:
        """The menu set for ``scope`` (e.g. ``{"type": "chat", "chat_id": …}``), as the bot sent it."""
        return list(self._commands.get(self._scope_key(scope, language_code), []))

    def _m_setMyCommands(self, p: JSON) -> bool:
        commands = p.get("commands")
        if not isinstance(commands, list) or len(commands) > 100:
            raise ApiError(400, "Bad Request: BOT_COMMANDS_TOO_MUCH" if isinstance(commands, list)
                           else "Bad Request: field \"commands\" must be an Array")
        for c in commands:
            name, description = (c.get("command"), c.get("description")) if isinstance(c, dict) else (None, None)
            if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_]{1,32}", name):
                raise ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not isinstance(description, str) or not 1 <= len(description) <= 256:
                raise ApiError(400, "Bad Request: BOT_COMMAND_DESCRIPTION_INVALID")
        if isinstance(p.get("scope"), dict) and "chat_id" in p["scope"]:
            self._chat({"chat_id": p["scope"]["chat_id"]})  # "chat not found" as Telegram answers
        key = self._scope_key(p.get("scope"), p.get("language_code"))
        if commands:
            self._commands[key] = [{"command": c["command"], "description": c["description"]} for c in commands]
        else:
            self._commands.pop(key, None)
        return True

    def _m_getMyCommands(self, p: JSON) -> list[Any]:
        return self.commands_for(p.get("scope"), p.get("language_code"))

    def _m_deleteMyCommands(self, p: JSON) -> bool:
        self._commands.pop(self._scope_key(p.get("scope"), p.get("language_code")), None)
        return True

    def _m_getForumTopicIconStickers(self, p: JSON) -> list[Any]:
        return []


def _coerce(name: str, value: Any) -> Any:
    """Type a raw field value the way Telegram reads that parameter."""
    if name in _STR_PARAMS:
        return value if isinstance(value, str) else json.dumps(value)
    if name in _INT_PARAMS:
        try:
            return int(value) if isinstance(value, str | int | float) and value != "" else value
        except ValueError:
            return value  # e.g. "@channelusername"
    if name in _FLOAT_PARAMS:
        try:
            return float(value)
        except (TypeError, ValueError):
            return value
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class _TagBalance(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.ok = True

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.ok = False


def _balanced_html(text: str) -> bool:
    """Telegram's HTML parse mode refuses unbalanced tags ("can't parse entities")."""
    parser = _TagBalance()
    parser.feed(text)
    parser.close()
    return parser.ok and not parser.stack
