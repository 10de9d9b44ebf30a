"""Inbound items: what the journal keeps for an owner message, and what each follower is given.

The journal keeps one **canonical item** per owner update (a record of ``core/records``, built by
``handlers/topic_messages``):

* ``message``: text, with the ``reply`` context when the owner replied to something;
* ``media``: every message that carries a file (document, photo, voice, audio, video, video note,
  animation), with each file's kind, duration and size; an album becomes one item with all its
  files when its parts are sealed (:func:`combine_album`), whatever its size (past
  ``MAX_MEDIA_FILES`` files, one item per that many);
* ``edit``: an owner edited a message;
* ``button``: an owner pressed a follower's inline button (journaled by ``leader/buttons``, bound
  to the follower process whose message carried it: ``for_instance``).

At delivery, :func:`adapt_for` gives each follower what it advertised it can take (docs/protocol.md, "Capabilities"):

* ``message`` goes to everyone (a transcribed voice note's file, ``transcribed_from``, only to
  ``transcript-v1`` followers: the others get the transcript as an ordinary message);
* ``media`` goes as it is to ``media-v1`` followers. Any other follower gets what documents and photos
  always were: a ``message`` whose ``document`` is the first file that can be downloaded (else the
  first file), with the caption and the reply context. The other files of an album do not reach
  such a follower;
* ``edit`` goes only to ``edit-v1`` followers. Any other follower never gets it: the row is settled
  as ``skipped`` (while it is online, the router tells the topic, see ``routing``);
* any other type goes to nobody but a follower with its capability;
* a generation-bound row (a ``button`` press) goes only to the follower process it was meant for,
  also after that process reconnected; a successor never gets it (the row is settled ``skipped``).

:class:`InboundScreen` is the delivery hub's one question per journal row: hold (an album still
gathering: nothing after it is sent either, so order is kept), settle without sending (expired
after the offline TTL, or a type this follower does not take), or send this item.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from loguru import logger

from topicbus.ports.store import Journal
from topicbus.core.clock import Clock
from topicbus.core.records import ButtonItem, EditItem, FileRef, InboundItem, MediaItem, MessageItem
from topicbus.metadata import clean_metadata
from topicbus.protocol import CAP_TRANSCRIPT, Capabilities
from topicbus.core.authority import Authority
from topicbus.core.journal import JournalItem

BOT_DOWNLOAD_LIMIT = 20 * 1024 * 1024  # getFile: bots may download files up to 20 MB
HOLD: Final = object()  # InboundScreen: stop here, this row is not ready (an album still gathering)

FILE_LABELS = {"document": "file", "photo": "photo", "voice": "voice message", "audio": "audio file",
               "video": "video", "video_note": "video message", "animation": "animation"}


# --- items made by the leader ----------------------------------------------------------------------
def transcript_item(media: MediaItem, text: str) -> MessageItem:
    """A voice note (a one-file ``media`` item) once transcribed: a ``message`` whose text is the
    transcript (cleaned already), with the note's caption, reply context and sender, and the file it
    was made from (``transcribed_from``, for ``follow --context``'s file line)."""
    return MessageItem(text=text, caption=media.caption, message_id=media.message_id,
                       from_user_id=media.from_user_id, from_name=media.from_name, date=media.date,
                       reply=media.reply, transcribed_from=media.files[0] if media.files else None)


def is_too_large(size: int | None) -> bool:
    return size is not None and size > BOT_DOWNLOAD_LIMIT


# --- what each follower is given ----------------------------------------------------------------
def adapt_for(item: InboundItem, capabilities: Capabilities | Iterable[str]) -> InboundItem | None:
    """The item to send to a follower with these capabilities; None when it gets nothing."""
    caps = Capabilities.of(capabilities)
    if isinstance(item, MediaItem) and not caps.may_receive(item.type):
        return media_as_message(item)
    if not caps.may_receive(item.type):
        return None
    if isinstance(item, MessageItem) and item.transcribed_from is not None and CAP_TRANSCRIPT not in caps:
        return dataclasses.replace(item, transcribed_from=None)
    return item


def media_as_message(item: MediaItem) -> MessageItem:
    """A ``media`` item as a ``message`` for a follower without media-v1: its first downloadable
    file (else its first file) as the ``document``, the caption and the reply context."""
    chosen = next((f for f in item.files if not f.too_large), item.files[0] if item.files else None)
    return MessageItem(text=None, caption=item.caption, message_id=item.message_id,
                       from_user_id=item.from_user_id, from_name=item.from_name, date=item.date,
                       document=None if chosen is None else chosen.as_document(), reply=item.reply)


def combine_album(parts: Sequence[InboundItem]) -> InboundItem:
    """One ``media`` item from the parts of an album, in the order they were journaled: every
    file, the caption (Telegram puts it on one part), and the first part's message id and sender.
    At most :data:`~topicbus.protocol.MAX_MEDIA_FILES` parts: a longer album is sealed as several
    items (``Journal.seal_group``), so no part is ever left out."""
    media = [p for p in parts if isinstance(p, MediaItem)]
    if not media:
        return parts[0]  # no part carries files (cannot happen for an album): the first, as it is
    first = media[0]
    files = tuple(f for p in media for f in p.files)
    caption = next((p.caption for p in media if p.caption), None)
    reply = next((p.reply for p in media if p.reply), None)
    return MediaItem(files=files, caption=caption, message_id=first.message_id, from_user_id=first.from_user_id,
                     from_name=first.from_name, date=first.date, reply=reply)


# --- words for the topic ------------------------------------------------------------------------
def size_text(size: int | None) -> str:
    if size is None:
        return "unknown size"
    return f"{size / (1024 * 1024):.1f} MB"


def too_large_files(item: InboundItem) -> list[FileRef]:
    return [f for f in item.files if f.too_large] if isinstance(item, MediaItem) else []


def too_large_notice(files: list[FileRef]) -> str:
    names = ", ".join(f"{FILE_LABELS.get(f.kind or '', 'file')} {clean_metadata(f.file_name, name=True)} "
                      f"({size_text(f.file_size)})".replace("  ", " ") for f in files)
    return (f"📎 Too large for the agent: {names}. Telegram lets bots download files up to 20 MB, so the "
            "agent is only told that it was sent. Send a smaller file, or a link to it.")


def duration_text(seconds: int | None) -> str:
    if seconds is None:
        return ""
    return f" {seconds // 60}:{seconds % 60:02d}"


def preview(item: InboundItem, limit: int = 60) -> str:
    """One short line that names an item for the owner (``/queue``, expiry notices)."""
    if isinstance(item, MediaItem):
        files = item.files
        if len(files) == 1:
            f = files[0]
            head = f"📎 {FILE_LABELS.get(f.kind or '', 'file')}{duration_text(f.duration)}"
            if f.kind in ("document", "audio") and clean_metadata(f.file_name, name=True):
                head += f" {clean_metadata(f.file_name, name=True)}"
        else:
            head = f"📎 album of {len(files)}"
        if any(f.too_large for f in files):
            head += " (too large)"
        body = item.caption or ""
        text = f"{head}: {body}" if body else head
    elif isinstance(item, EditItem):
        text = f"✏️ edit: {item.text or ''}"
    elif isinstance(item, ButtonItem):
        text = f"🔘 button: {item.data or ''}"
    elif isinstance(item, MessageItem):
        text = item.text or item.caption or ""
        if item.document is not None:
            text = f"📎 {item.document.file_name or 'file'}" + (f": {text}" if text else "")
    else:
        text = ""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def age_text(ms: int) -> str:
    """A duration for a phone screen: ``45 s``, ``12 min``, ``3 h 5 min``, ``2 d 4 h``."""
    s = max(ms, 0) // 1000
    if s < 60:
        return f"{s} s"
    m = s // 60
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


# --- the delivery hub's question ----------------------------------------------------------------
class InboundScreen:
    """Decides, for each journal row the hub is about to send, what the follower gets.

    Rows older than the offline TTL are never sent (a command typed hours ago must not run in
    whatever process registers next): they are settled ``expired`` here, and :attr:`expired` is
    set so that the topic is told at once (``agent_commands.OfflineQueue``)."""

    def __init__(self, journal: Journal, clock: Clock, authority: Callable[[], Authority], *,
                 offline_ttl_ms: int | None = None):
        self._journal = journal
        self._clock = clock
        self._authority = authority
        self.offline_ttl_ms = offline_ttl_ms
        self.expired = asyncio.Event()

    def is_expired(self, item: JournalItem, now_ms: int) -> bool:
        ttl = self.offline_ttl_ms
        return bool(ttl) and item.created_at_ms > 0 and now_ms - item.created_at_ms > ttl  # type: ignore[operator]

    async def screen(self, binding_key: str, capabilities: frozenset[str], item: JournalItem,
                     instance_id: str | None = None) -> Any:
        """:data:`HOLD`, None (settled here, nothing to send) or the item to send to the follower
        ``instance_id`` (None: whichever follower holds the binding)."""
        if item.status == "gathering":
            return HOLD
        now = self._clock.now_ms()
        if self.is_expired(item, now):
            if await self._journal.settle(item.seq, binding_key, "expired", now, self._authority()):
                logger.bind(phase="delivery").info("delivery {} expired before its follower took it", item.delivery_id)
                self.expired.set()
            return None
        if item.for_instance is not None and instance_id is not None and item.for_instance != instance_id:
            logger.bind(phase="delivery").info("delivery {} ({}) not sent: it was meant for an earlier process",
                                               item.delivery_id, item.payload.type)
            await self._journal.settle(item.seq, binding_key, "skipped", now, self._authority())
            return None
        adapted = adapt_for(item.payload, capabilities)
        if adapted is None:
            logger.bind(phase="delivery").info("delivery {} ({}) not sent: the follower does not take this type",
                                               item.delivery_id, item.payload.type)
            await self._journal.settle(item.seq, binding_key, "skipped", now, self._authority())
        return adapted
