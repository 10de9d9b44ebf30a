"""The follower side's public data, errors and the text splitter (used by :class:`FollowerClient`
and ``topicbus follow``); the names follower authors use are listed once, in ``topicbus.__all__``."""

from __future__ import annotations

from dataclasses import dataclass

from topicbus.protocol import MAX_TEXT_CHARS


@dataclass(frozen=True)
class Assignment:
    """The topic the leader assigned to this follower (the ``follower.register`` ack result)."""

    chat_id: int
    thread_id: int
    slot: str
    display_title: str
    binding_key: str


@dataclass(frozen=True)
class Delivery:
    """One owner message (``leader.deliver`` of a ``message`` item, or of a ``media`` item for a client
    made with ``media=True``).

    ``document``: the file of a message that carries one (for a ``media`` item, its first file that
    can be downloaded), ``{"fileId", "fileName", "mimeType", "fileSize"}``; save it with
    :meth:`FollowerClient.download_to` (streamed to a file, checked against ``fileSize``) or read it
    with :meth:`FollowerClient.download_document`. ``fileName`` is Telegram metadata chosen by
    whoever made the file: clean it (:func:`topicbus.metadata.clean_metadata`) before using it in a
    path or typing it. ``files`` (``media`` items only, else None): every file,
    each also with ``kind`` (``document``, ``photo``, ``voice``, ``audio``, ``video``, ``video_note``,
    ``animation``), ``duration`` (seconds) and ``tooLarge`` (over the Bot API's 20 MB: it cannot be
    fetched); an album is one delivery. ``reply``: what the owner replied to, ``{"messageId", "text",
    "fromName", "fromAgent", "quote"}`` (``fromAgent``: the agent's own output), else None.
    ``transcribed_from`` (transcript-v1, a client made with ``media=True``): ``text`` is the leader's
    transcript of this voice note or audio file, which is that file (a ``files`` entry), else None."""

    delivery_id: str
    text: str | None
    caption: str | None
    message_id: int | None
    from_user_id: int | None
    from_name: str | None
    date: int | None
    document: dict | None
    reply: dict | None = None
    files: list[dict] | None = None
    transcribed_from: dict | None = None


@dataclass(frozen=True)
class Edit:
    """One ``edit`` delivery (edit-v1, for a client made with ``on_edit``): an owner edited a message
    this follower already received (``message_id``); ``text`` is its new text, else its new caption."""

    delivery_id: str
    message_id: int
    text: str | None


class FollowerError(Exception):
    """Base class of the client's errors."""


class FollowerSuperseded(FollowerError):
    """A newer registration took this follower identity over; the client stopped for good."""


class FollowerRefused(FollowerError):
    """The leader refused this follower for a reason retrying cannot fix (``.code`` says which)."""

    def __init__(self, code: str, message: str = ""):
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class FollowerSendError(FollowerError):
    """One ``follower.send`` was refused for good: by the leader (``foreign-target``,
    ``invalid-envelope``…) or locally, before sending, with ``unsupported-by-leader`` when the message
    uses a field the leader did not advertise a capability for (docs/protocol.md, "Capabilities")."""

    def __init__(self, code: str, message: str = ""):
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class FollowerClosed(FollowerError):
    """The client was closed (or never started) while the call was waiting."""


class FollowerDownloadError(FollowerError):
    """A file could not be downloaded whole: the leader refused it (HTTP status), the transfer broke
    off or timed out, it ended before or ran past the size Telegram reported, or it could not be
    written. ``too_large`` is True when it is over the download limit (Telegram lets bots download
    20 MB); ``status`` is the leader's HTTP status when it refused the file (a final answer: asking
    again gets the same), None when the transfer itself failed. Nothing of it is kept: no partial or
    temporary file is left."""

    def __init__(self, message: str, *, too_large: bool = False, status: int | None = None):
        super().__init__(message)
        self.too_large = too_large
        self.status = status



@dataclass(frozen=True)
class Control:
    """One ``control`` delivery (control-v1): an owner's ``/interrupt``, ``/kill`` or ``/eof`` for this
    follower generation (``action`` is ``"interrupt"``, ``"kill"`` or ``"eof"``; ``"screen"`` for
    ``/screen``, only to a client created with ``screenshots=True``)."""

    delivery_id: str
    action: str
    message_id: int | None


@dataclass(frozen=True)
class ButtonPress:
    """One ``button`` delivery (button-v1): an owner pressed an inline button this follower attached;
    ``data`` is the button's data."""

    delivery_id: str
    data: str
    message_id: int | None
    from_user_id: int | None


@dataclass(frozen=True)
class Button:
    """One inline button under a message: its label, and the data a press sends back
    (``on_button`` receives it as :class:`ButtonPress`)."""

    text: str
    data: str


class DeliveryDeclined(Exception):
    """Raised by a delivery callback for an item it could not take (for example: the child's stdin is
    closed). The item is not acknowledged, so the leader keeps it and hands it to the next follower of
    the workspace; unlike any other exception, this is an expected outcome and is logged without a
    traceback."""


def split_text(text: str, limit: int = MAX_TEXT_CHARS) -> list[str]:
    """Split ``text`` into chunks of at most ``limit`` characters, preferring line boundaries.

    Rules, applied from the front:

    * the remaining text, when it fits (``len <= limit``), is the last chunk;
    * otherwise look for the last ``"\\n"`` among the first ``limit + 1`` characters, at an index
      ``i >= 1``: the chunk is ``text[:i]`` and that one newline is **consumed** (it is the split
      point; a message boundary shows the line break);
    * otherwise (no such newline) hard-split: the chunk is ``text[:limit]`` and nothing is consumed.

    No chunk is empty and an empty input gives ``[]``. Consequently the input is exactly the chunks
    concatenated with the consumed newlines put back: after each chunk except the last, the next
    input character is a ``"\\n"`` that was consumed if and only if it is a newline (a hard split is
    never followed by a newline, since that newline would have been chosen as the split point).
    A single trailing newline right after a split point is consumed too, so the last chunk may end
    the input one ``"\\n"`` early.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    chunks: list[str] = []
    start = 0
    end = len(text)
    while start < end:
        if end - start <= limit:
            chunks.append(text[start:])
            break
        cut = text.rfind("\n", start + 1, start + limit + 1)
        if cut > start:
            chunks.append(text[start:cut])
            start = cut + 1
        else:
            chunks.append(text[start : start + limit])
            start += limit
    return chunks


_FENCE = ("```", "~~~")


def split_markdown(text: str, limit: int = MAX_TEXT_CHARS) -> list[str]:
    """:func:`split_text` for Markdown that never leaves a fenced code block broken: a chunk that ends
    inside a fence closes it, and the next chunk opens it again (with its language), so every chunk
    renders on its own and a code block stays a code block on both sides."""
    chunks: list[str] = []
    opened: str | None = None  # the fence line currently open, e.g. "```python"
    for chunk in split_text(text, max(16, limit - 16)):  # room for a closing and a reopening fence
        body = f"{opened}\n{chunk}" if opened else chunk
        for line in chunk.split("\n"):
            stripped = line.strip()
            if stripped.startswith(_FENCE):
                opened = None if opened is not None else stripped
        chunks.append(f"{body}\n{opened[:3]}" if opened else body)
    return chunks
