"""What `topicbus follow` types into the child for each owner message, document and button press."""

from __future__ import annotations

import asyncio
import mimetypes
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loguru import logger

from topicbus.follower.client import FollowerClient
from topicbus.follower.model import (Delivery, DeliveryDeclined, Edit, FollowerClosed, FollowerDownloadError,
                                     FollowerError)
from topicbus.metadata import clean_metadata
from topicbus.protocol import CAP_FORMAT
from topicbus.retry import Backoff

__all__ = ["INBOX_DIR", "Received", "context_line", "delivery_input", "delivery_text", "edit_text",
           "save_document", "save_files", "save_transcribed", "transcript_text", "typed_name"]

INBOX_DIR = os.path.join(".topicbus", "inbox")
# A download whose transfer broke off is tried again (the leader may be restarting, or Telegram
# hiccuped); one the leader refused (an HTTP status) is not. When the leader's connection is gone
# after a failed try, the delivery is declined instead: the leader delivers it again on return.
DOWNLOAD_ATTEMPTS = 3
DOWNLOAD_RETRY_S = 0.5
_LINE_BREAK = re.compile(r"\r\n|\r")
_COMPOUND = re.compile(r"\s*(async\s+)?(for|while|if|with|def|class|try|match)\b.*:")


@dataclass(frozen=True)
class Received:
    """What became of one file of an owner message: saved at ``path``, or not, and ``problem`` says
    why: ``"failed"`` (the download failed, broke off, or was not the size Telegram reported) or
    ``"too large"`` (over the 20 MB that bots may download). ``name`` is the file's clean name
    (:func:`~topicbus.metadata.clean_metadata`), ``"unnamed"`` when it has none."""

    kind: str
    name: str
    path: str | None = None
    problem: str | None = None

    def line(self) -> str:
        """``[<kind> <path>]``, ``[<kind> <name> failed]``, ``[<kind> <name> too large]``, or
        ``[<kind> <name>]`` for a file nobody tried to save."""
        if self.path is not None:
            return f"[{self.kind} {self.path}]"
        return f"[{self.kind} {self.name}{' ' + self.problem if self.problem else ''}]"


def typed_name(file: Mapping[str, Any]) -> str:
    """The name a file is typed with: its clean name, else ``unnamed``."""
    return clean_metadata(file.get("fileName"), name=True) or "unnamed"


def _kind_of(file: Mapping[str, Any], default: str = "document") -> str:
    kind = file.get("kind")
    return kind if isinstance(kind, str) and kind else default  # the protocol validated it (FileRef.kind)


def _unattempted(file: Mapping[str, Any], kind: str) -> Received:
    return Received(kind, typed_name(file), problem="too large" if file.get("tooLarge") else None)


def delivery_text(delivery: Delivery, saved_path: Received | None = None,
                  saved_files: Sequence[Received | None] | None = None) -> str | None:
    """The text one delivery types (without the final newline), or None when it carries nothing.

    The text, else the caption; a multi-line message keeps its line breaks (``\r\n`` and ``\r``
    become ``\n``), nothing else is changed: what the owner wrote is typed as written. A document
    is announced first by :meth:`Received.line` of ``saved_path`` (what :func:`save_document` made
    of it), ``[document <path>]`` when saved, ``[document <name> failed]`` or ``[document <name> too
    large]`` when not, followed by the caption when there is one; ``[document <name>]`` when it was
    not tried. A name is Telegram metadata: it is typed only as :func:`~topicbus.metadata.clean_metadata`
    makes it, so it never breaks the line.

    A ``media`` delivery (``delivery.files``: voice, audio, video, an album…) types one such line
    per file (``saved_files``, in the same order, from :func:`save_files`; a file without a result
    is ``[<kind> <name> too large]`` when it is over 20 MB, else ``[<kind> <name>]``); the caption
    follows the first line."""
    if delivery.files is not None:
        saved = list(saved_files or [])
        lines = []
        for index, file in enumerate(delivery.files):
            result = saved[index] if index < len(saved) else None
            lines.append((result or _unattempted(file, _kind_of(file))).line())
        if not lines:
            return None
        if delivery.caption:
            lines[0] += f" {delivery.caption}"
        return _LINE_BREAK.sub("\n", "\n".join(lines))
    if saved_path is not None:
        body = saved_path.line() + (f" {delivery.caption}" if delivery.caption else "")
    elif delivery.text is not None:
        body = delivery.text
    elif delivery.caption is not None:
        body = delivery.caption
    elif delivery.document is not None:
        body = _unattempted(delivery.document, "document").line()
    else:
        return None
    return _LINE_BREAK.sub("\n", body)


def transcript_text(delivery: Delivery, saved: Received | None = None, *, context: bool = False) -> str:
    """What a transcribed voice note types (``delivery.transcribed_from``): the transcript, as a
    message the owner wrote (the leader made it one line). With ``context`` the file line follows,
    :meth:`Received.line` of ``saved`` (``[<kind> <path>]``, or its clean name and why it was not
    saved), with the caption after it; without, the caption follows on its own line when there is
    one."""
    lines = [delivery.text or ""]
    file = delivery.transcribed_from or {}
    if context:
        line = (saved or _unattempted(file, _kind_of(file, "voice"))).line()
        lines.append(line + (f" {delivery.caption}" if delivery.caption else ""))
    elif delivery.caption:
        lines.append(delivery.caption)
    return _LINE_BREAK.sub("\n", "\n".join(lines))


def context_line(delivery: Delivery, limit: int = 200) -> str | None:
    """``follow --context``: the line typed before a reply, ``[reply to <whom>: <text>]`` (with the
    quote instead of the text when the owner quoted part of it), or None for a message that replies
    to nothing. Only its first line, at most ``limit`` characters, is kept."""
    reply = delivery.reply
    if not reply:
        return None
    whom = "the agent" if reply.get("fromAgent") else (clean_metadata(reply.get("fromName")) or "a message")
    said = reply.get("quote") or reply.get("text") or ""
    said = _first_line(said, limit)
    return f"[reply to {whom}: {said}]" if said else f"[reply to {whom}]"


def edit_text(edit: Edit, limit: int = 4096) -> str:
    """``follow --context``: what an owner's edit types, ``[edit] <new text>`` (the new text's line
    breaks kept)."""
    return _LINE_BREAK.sub("\n", f"[edit] {(edit.text or '')[:limit]}".rstrip())


def _first_line(text: str, limit: int) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def delivery_input(text: str, *, end_blocks: bool = False) -> bytes:
    """The bytes written to the child for ``text``: its lines, then a newline. With ``end_blocks``
    one more, empty, line follows a multi-line text or a one-line compound statement
    (``while True: pass``): it ends the block in Python's REPL."""
    data = text + "\n"
    if end_blocks and ("\n" in text or _COMPOUND.match(text)):
        data += "\n"
    return data.encode("utf-8", "surrogatepass")


async def save_document(client: FollowerClient, delivery: Delivery, inbox: str) -> Received | None:
    """Download an owner's document into ``inbox`` (``<cwd>/.topicbus/inbox``) with :func:`save_files`'
    rules; None for a delivery without one."""
    if delivery.document is None:
        return None
    return (await _save_all(client, delivery, [delivery.document], inbox, "document"))[0]


async def save_files(client: FollowerClient, delivery: Delivery, inbox: str) -> list[Received]:
    """Download each file of a ``media`` delivery into ``inbox``; what became of each, in order.

    A file is saved as ``<message id>-<part, from 1>-<clean name>`` (a voice or video note, which has
    no name, as its kind and its type's extension) with :meth:`FollowerClient.download_to`: streamed,
    complete and of the size Telegram reported, or not at all; a name that is taken gets ``-1``,
    ``-2``… before its extension, so no file overwrites another. A file over Telegram's 20 MB (which
    the leader marks) is not fetched. The topic is told once, in one message, of every file that
    failed or turned out too large to fetch (the leader already told it of those it marked)."""
    return await _save_all(client, delivery, list(delivery.files or []), inbox, None)


async def save_transcribed(client: FollowerClient, delivery: Delivery, inbox: str) -> Received:
    """Download the file a transcript was made from (``follow --context``), with :func:`save_files`'
    rules."""
    file = delivery.transcribed_from or {}
    return (await _save_all(client, delivery, [file], inbox, _kind_of(file, "voice")))[0]


async def _save_all(client: FollowerClient, delivery: Delivery, files: list[Mapping[str, Any]], inbox: str,
                    kind: str | None) -> list[Received]:
    results = []
    for index, file in enumerate(files):
        results.append(await _save(client, file, delivery, inbox, kind or _kind_of(file), index + 1))
    unsaved = [r for r, file in zip(results, files) if r.problem and not file.get("tooLarge")]
    if unsaved:
        await _tell_topic(client, unsaved)
    return results


async def _save(client: FollowerClient, file: Mapping[str, Any], delivery: Delivery, inbox: str, kind: str,
                part: int) -> Received:
    name = typed_name(file)
    if file.get("tooLarge"):
        return Received(kind, name, problem="too large")
    file_id = file.get("fileId")
    if not isinstance(file_id, str) or not file_id:
        return Received(kind, name, problem="failed")
    size = file.get("fileSize")
    on_disk = clean_metadata(file.get("fileName"), name=True)
    if not on_disk:  # voice notes and video notes come without a name: the kind, and the type's extension
        on_disk = kind + (mimetypes.guess_extension(str(file.get("mimeType") or "")) or "")
    stem = clean_metadata(delivery.message_id or delivery.delivery_id, name=True)
    backoff = Backoff(initial=DOWNLOAD_RETRY_S, maximum=4 * DOWNLOAD_RETRY_S)
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        try:
            path = await client.download_to(file_id, os.path.join(inbox, f"{stem}-{part}-{on_disk}"),
                                            size=size if isinstance(size, int) and size >= 0 else None)
        except FollowerDownloadError as exc:
            final = exc.too_large or exc.status is not None or attempt == DOWNLOAD_ATTEMPTS
            if not final:  # the transfer broke off: the leader may be restarting, or Telegram hiccuped
                await asyncio.sleep(backoff.next())
            if not client.connected:  # the leader went away meanwhile: it delivers the item again
                raise DeliveryDeclined("the leader went away during a file's download") from None
            if final:
                logger.warning("follow: file {} not saved ({})", file_id, exc)
                return Received(kind, name, problem="too large" if exc.too_large else "failed")
        except FollowerClosed:
            raise DeliveryDeclined("the follower client is closing") from None
        else:
            return Received(kind, name, path=path)
    raise AssertionError("unreachable: the last attempt returns")


async def _tell_topic(client: FollowerClient, unsaved: list[Received]) -> None:
    """One message in the topic naming every file that could not be saved, and why."""
    why = {"too large": "over the 20 MB bots may download"}
    parts = [f"{r.kind} {r.name} ({why.get(r.problem or '', 'download failed')})" for r in unsaved]
    text = (f"📎 Not saved for the agent: {', '.join(parts)}. The agent is told that it was sent and not saved. "
            "Send it again to retry.")
    try:
        if CAP_FORMAT in client.leader_capabilities:
            await client.send_text(text, format="plain")
        else:
            await client.send_text(text)
    except FollowerError as exc:
        logger.warning("follow: could not tell the topic about an unsaved file ({})", type(exc).__name__)
