"""Inbound items: what the journal keeps for an owner message, and what each follower is given.

The journal keeps one **canonical item** per owner update (built by ``handlers/topic_messages``):

* ``message``: text, with the ``reply`` context when the owner replied to something;
* ``media``: every message that carries a file (document, photo, voice, audio, video, video note,
  animation), with each file's kind, duration and size; an album becomes one item with all its
  files when its parts are sealed (:func:`combine_album`), whatever its size (past
  ``MAX_MEDIA_FILES`` files, one item per that many);
* ``edit``: an owner edited a message;
* ``button``: an owner pressed a follower's inline button (journaled by ``leader/buttons``, bound
  to the follower process whose message carried it: ``for_instance``).

At delivery, :func:`adapt_for` gives each follower what it advertised it can take (SPEC §9.1):

* ``message`` goes to everyone (a transcribed voice note's ``transcribedFrom`` only to
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
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from loguru import logger

from topicbus.ports.store import Journal
from topicbus.core.clock import Clock
from topicbus.protocol import ButtonItem, Capabilities, ControlItem, EditItem, MediaItem, message_item
from topicbus.metadata import clean_metadata
from topicbus.core.authority import Authority
from topicbus.core.journal import JournalItem

BOT_DOWNLOAD_LIMIT = 20 * 1024 * 1024  # getFile: bots may download files up to 20 MB
HOLD: Final = object()  # InboundScreen: stop here, this row is not ready (an album still gathering)

FILE_LABELS = {"document": "file", "photo": "photo", "voice": "voice message", "audio": "audio file",
               "video": "video", "video_note": "video message", "animation": "animation"}


# --- items, validated by the protocol's models ---------------------------------------------------
def media_item(**fields: Any) -> dict[str, Any]:
    """A ``media`` delivery item (wire names), validated, every field present."""
    return MediaItem.model_validate({**fields, "type": "media"}).model_dump(by_alias=True)


def edit_item(message_id: int, text: str | None) -> dict[str, Any]:
    return EditItem.model_validate({"type": "edit", "messageId": message_id, "text": text}).model_dump(by_alias=True)


def control_item(action: str, message_id: int | None = None) -> dict[str, Any]:
    return ControlItem.model_validate({"type": "control", "action": action,
                                       "messageId": message_id}).model_dump(by_alias=True)


def button_item(data: str, message_id: int | None, from_user_id: int | None) -> dict[str, Any]:
    """A ``button`` delivery item: an owner pressed the button with this ``data`` under ``message_id``."""
    return ButtonItem.model_validate({"type": "button", "data": data, "messageId": message_id,
                                      "fromUserId": from_user_id}).model_dump(by_alias=True)


def transcript_item(media: Mapping[str, Any], text: str) -> dict[str, Any]:
    """A voice note (a one-file ``media`` item) once transcribed: a ``message`` whose text is the
    transcript (cleaned already), with the note's caption, reply context and sender, and the file it
    was made from (``transcribedFrom``, for ``follow --context``'s file line)."""
    files = list(media.get("files") or [])
    return message_item(text=text, caption=media.get("caption"), messageId=media.get("messageId"),
                        fromUserId=media.get("fromUserId"), fromName=media.get("fromName"), date=media.get("date"),
                        document=None, reply=media.get("reply"), transcribedFrom=files[0] if files else None)


def is_too_large(size: int | None) -> bool:
    return size is not None and size > BOT_DOWNLOAD_LIMIT


# --- what each follower is given ----------------------------------------------------------------
def adapt_for(item: Mapping[str, Any], capabilities: Capabilities | Iterable[str]) -> dict[str, Any] | None:
    """The item to send to a follower with these capabilities; None when it gets nothing."""
    caps = Capabilities.of(capabilities)
    kind = item.get("type")
    if not isinstance(kind, str):
        return None
    if kind == "media" and not caps.may_receive("media"):
        return media_as_message(item)
    return caps.delivery_fields(item) if caps.may_receive(kind) else None


def media_as_message(item: Mapping[str, Any]) -> dict[str, Any]:
    """A ``media`` item as a ``message`` for a follower without media-v1: its first downloadable
    file (else its first file) as the ``document``, the caption and the reply context."""
    files = list(item.get("files") or [])
    chosen = next((f for f in files if not f.get("tooLarge")), files[0] if files else None)
    document = None if chosen is None else {k: chosen.get(k) for k in ("fileId", "fileName", "mimeType", "fileSize")}
    return message_item(text=None, caption=item.get("caption"), messageId=item.get("messageId"),
                        fromUserId=item.get("fromUserId"), fromName=item.get("fromName"), date=item.get("date"),
                        document=document, reply=item.get("reply"))


def combine_album(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``media`` item from the parts of an album, in the order they were journaled: every
    file, the caption (Telegram puts it on one part), and the first part's message id and sender.
    At most :data:`~topicbus.protocol.MAX_MEDIA_FILES` parts: a longer album is sealed as several
    items (``Journal.seal_group``), so no part is ever left out."""
    media = [p for p in parts if p.get("type") == "media"] or parts
    first = media[0]
    files = [f for p in media for f in (p.get("files") or [])]
    caption = next((p.get("caption") for p in media if p.get("caption")), None)
    reply = next((p.get("reply") for p in media if p.get("reply")), None)
    return media_item(files=files, caption=caption, messageId=first.get("messageId"),
                      fromUserId=first.get("fromUserId"), fromName=first.get("fromName"), date=first.get("date"),
                      reply=reply)


# --- words for the topic ------------------------------------------------------------------------
def size_text(size: int | None) -> str:
    if size is None:
        return "unknown size"
    return f"{size / (1024 * 1024):.1f} MB"


def too_large_files(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [f for f in (item.get("files") or []) if f.get("tooLarge")] if item.get("type") == "media" else []


def too_large_notice(files: list[dict[str, Any]]) -> str:
    names = ", ".join(f"{FILE_LABELS.get(f.get('kind') or '', 'file')} {clean_metadata(f.get('fileName'), name=True)} "
                      f"({size_text(f.get('fileSize'))})".replace("  ", " ") for f in files)
    return (f"📎 Too large for the agent: {names}. Telegram lets bots download files up to 20 MB, so the "
            "agent is only told that it was sent. Send a smaller file, or a link to it.")


def duration_text(seconds: int | None) -> str:
    if seconds is None:
        return ""
    return f" {seconds // 60}:{seconds % 60:02d}"


def preview(item: Mapping[str, Any], limit: int = 60) -> str:
    """One short line that names an item for the owner (``/queue``, expiry notices)."""
    kind = item.get("type")
    if kind == "media":
        files = list(item.get("files") or [])
        if len(files) == 1:
            f = files[0]
            head = f"📎 {FILE_LABELS.get(f.get('kind') or '', 'file')}{duration_text(f.get('duration'))}"
            if f.get("kind") in ("document", "audio") and clean_metadata(f.get("fileName"), name=True):
                head += f" {clean_metadata(f.get('fileName'), name=True)}"
        else:
            head = f"📎 album of {len(files)}"
        if any(f.get("tooLarge") for f in files):
            head += " (too large)"
        body = item.get("caption") or ""
        text = f"{head}: {body}" if body else head
    elif kind == "edit":
        text = f"✏️ edit: {item.get('text') or ''}"
    elif kind == "button":
        text = f"🔘 button: {item.get('data') or ''}"
    else:
        text = item.get("text") or item.get("caption") or ""
        document = item.get("document")
        if isinstance(document, Mapping):
            text = f"📎 {document.get('fileName') or 'file'}" + (f": {text}" if text else "")
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
                                               item.delivery_id, item.payload.get("type"))
            await self._journal.settle(item.seq, binding_key, "skipped", now, self._authority())
            return None
        adapted = adapt_for(item.payload, capabilities)
        if adapted is None:
            logger.bind(phase="delivery").info("delivery {} ({}) not sent: the follower does not take this type",
                                               item.delivery_id, item.payload.get("type"))
            await self._journal.settle(item.seq, binding_key, "skipped", now, self._authority())
        return adapted
