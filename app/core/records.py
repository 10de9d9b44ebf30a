"""The records of the leader's data path, typed and snake_case: what an owner sends a follower (inbound
items), what a follower or the leader posts in a topic (outbox items), a delivery and the other frame the
leader pushes to a follower, and the answers to a follower's requests.

Plain frozen dataclasses, one home each. They are converted at the edges only, one converter each way
per edge: the bus protocol (``protocol.py``, whose wire models carry the same names and the camelCase
field names), the Telegram handlers (a PTB update becomes an inbound item, ``handlers/``), and the
stored JSON of the journal and the outbox (``storage/journal.py``, ``storage/outbox.py``). Nothing past
those edges sees a wire dict.

An item's ``type`` is the delivery type a follower's capabilities are asked about (``message``,
``media``, ``edit``, ``control``, ``button``); an outbox item's ``type`` is the ``kind`` its row is
planned by (``core/output.QueuedItem.kind``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# --- inbound items: what an owner sent, for the follower of the topic --------------------------------


@dataclass(frozen=True, slots=True)
class DocumentRef:
    """A routed owner file as a ``message`` item carries it (the bytes are fetched by its id)."""

    file_id: str | None = None
    file_name: str | None = None
    mime_type: str | None = None
    file_size: int | None = None


@dataclass(frozen=True, slots=True)
class FileRef:
    """One file of a ``media`` item: what :class:`DocumentRef` says, its kind (document, photo, voice,
    audio, video, video_note, animation) and, for sound and video, its duration in seconds."""

    file_id: str | None = None
    file_name: str | None = None
    mime_type: str | None = None
    file_size: int | None = None
    kind: str = "document"
    duration: int | None = None
    too_large: bool = False  # over the 20 MB bots may download

    def as_document(self) -> DocumentRef:
        return DocumentRef(self.file_id, self.file_name, self.mime_type, self.file_size)


@dataclass(frozen=True, slots=True)
class ReplyContext:
    """What an owner message replied to: the replied-to message, and the quoted part if any."""

    message_id: int | None = None
    text: str | None = None  # its text, else its caption
    from_name: str | None = None
    from_agent: bool = False  # the agent's own output (posted by the bot)
    quote: str | None = None


@dataclass(frozen=True, slots=True)
class MessageItem:
    """An owner's text (every follower takes these); ``transcribed_from``: the text is the transcript
    of this voice note (only a transcript-v1 follower is told)."""

    type: ClassVar[str] = "message"
    text: str | None = None
    caption: str | None = None
    message_id: int | None = None
    from_user_id: int | None = None
    from_name: str | None = None
    date: int | None = None
    document: DocumentRef | None = None
    reply: ReplyContext | None = None
    transcribed_from: FileRef | None = None


@dataclass(frozen=True, slots=True)
class MediaItem:
    """An owner message with files (one, or a whole album), media-v1."""

    type: ClassVar[str] = "media"
    files: tuple[FileRef, ...]
    caption: str | None = None
    message_id: int | None = None  # the first message of an album
    from_user_id: int | None = None
    from_name: str | None = None
    date: int | None = None
    reply: ReplyContext | None = None


@dataclass(frozen=True, slots=True)
class EditItem:
    """An owner edited a message the follower received (edit-v1): the new text, else the new caption."""

    type: ClassVar[str] = "edit"
    message_id: int
    text: str | None = None


@dataclass(frozen=True, slots=True)
class ControlItem:
    """A reserved command for one follower generation (control-v1): interrupt, kill, eof, screen."""

    type: ClassVar[str] = "control"
    action: str
    message_id: int | None = None


@dataclass(frozen=True, slots=True)
class ButtonItem:
    """An owner pressed one of the follower's inline buttons (button-v1)."""

    type: ClassVar[str] = "button"
    data: str
    message_id: int | None = None  # the message that carried the button
    from_user_id: int | None = None


@dataclass(frozen=True, slots=True)
class UnknownItem:
    """A journaled item of a type this version does not know (a newer leader journaled it before this one
    took over): it goes to no follower, as the type of any item whose capability a follower lacks."""

    type: str


InboundItem = MessageItem | MediaItem | EditItem | ControlItem | ButtonItem | UnknownItem


# --- outbox items: what goes into a topic, in order ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Button:
    """One inline button a follower attaches; ``data`` comes back in a ``button`` item when pressed."""

    text: str
    data: str


@dataclass(frozen=True, slots=True)
class TextMessage:
    """A follower's text: its ``format`` (None: plain), its buttons, whether it is a ``tail`` (a line
    still being redrawn, replaced by what follows) or a ``screen`` frame (replaces the screen message)."""

    type: ClassVar[str] = "text"
    text: str
    format: str | None = None
    buttons: tuple[tuple[Button, ...], ...] = ()
    tail: bool = False
    screen: bool = False


@dataclass(frozen=True, slots=True)
class ChatActionMessage:
    """A chat action (``typing`` …) shown in the topic for a few seconds."""

    type: ClassVar[str] = "chat_action"
    action: str


@dataclass(frozen=True, slots=True)
class DocumentMessage:
    """A file the follower posts."""

    type: ClassVar[str] = "document"
    file_name: str
    data: bytes
    caption: str | None = None


@dataclass(frozen=True, slots=True)
class PhotoMessage:
    """An image the follower posts as a photo (photo-v1); sent as a file when Telegram refuses it."""

    type: ClassVar[str] = "photo"
    file_name: str
    data: bytes
    caption: str | None = None


@dataclass(frozen=True, slots=True)
class Notice:
    """The leader's own words in a topic; ``reply_to``: the message it answers (a voice note's transcript)."""

    type: ClassVar[str] = "notice"
    text: str
    reply_to: int | None = None


OutboxItem = TextMessage | ChatActionMessage | DocumentMessage | PhotoMessage | Notice


# --- what the leader pushes to a follower, and its answers -------------------------------------------


@dataclass(frozen=True, slots=True)
class Deliver:
    """One item for one follower generation (``leader.deliver``); the receipt names ``delivery_id``."""

    delivery_id: str
    instance_id: str
    registration_generation: str
    item: InboundItem


@dataclass(frozen=True, slots=True)
class Superseded:
    """A newer registration took this follower's workspace over (``leader.superseded``)."""

    instance_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class RegistrationResult:
    """The answer to ``follower.register``: the topic assigned."""

    chat_id: int
    thread_id: int
    slot: str
    display_title: str
    binding_key: str


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """The answer to ``follower.heartbeat``: the topic's title now (display-title-v1)."""

    display_title: str | None


@dataclass(frozen=True, slots=True)
class SendResult:
    """The answer to ``follower.send``: the outbox row that holds the output."""

    outbox_id: int


#: What answers a follower request (a disconnect's answer is None: nothing to say).
RequestResult = RegistrationResult | HeartbeatResult | SendResult
