"""What `topicbus follow` types into the child for each owner message, document and button press."""

from __future__ import annotations

import mimetypes
import os
import re

from loguru import logger

from topicbus.follower.client import FollowerClient
from topicbus.follower.model import Delivery, Edit

__all__ = ["INBOX_DIR", "context_line", "delivery_input", "delivery_text", "edit_text", "save_document",
           "save_files", "save_transcribed", "transcript_text"]

INBOX_DIR = os.path.join(".topicbus", "inbox")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")
_LINE_BREAK = re.compile(r"\r\n|\r")
_COMPOUND = re.compile(r"\s*(async\s+)?(for|while|if|with|def|class|try|match)\b.*:")


def delivery_text(delivery: Delivery, saved_path: str | None = None,
                  saved_files: list[str | None] | None = None) -> str | None:
    """The text one delivery types (without the final newline), or None when it carries nothing.

    The text, else the caption, else ``[document <fileName>]``; a multi-line message keeps its line
    breaks (``\r\n`` and ``\r`` become ``\n``), nothing else is changed. A document saved to disk
    is announced first as ``[document <path>]``, followed by the caption when there is one.

    A ``media`` delivery (``delivery.files``: voice, audio, video, an album…) types one line per file,
    ``[<kind> <path>]`` for a file saved (``saved_files``, in the same order), ``[<kind> <name>
    too large]`` for one over Telegram's 20 MB and ``[<kind> <name>]`` for one that could not be
    saved; the caption follows the first line."""
    if delivery.files is not None:
        saved = list(saved_files or [])
        lines = []
        for index, file in enumerate(delivery.files):
            kind = str(file.get("kind") or "document")
            path = saved[index] if index < len(saved) else None
            name = file.get("fileName") or "unnamed"
            if path is not None:
                lines.append(f"[{kind} {path}]")
            elif file.get("tooLarge"):
                lines.append(f"[{kind} {name} too large]")
            else:
                lines.append(f"[{kind} {name}]")
        if not lines:
            return None
        if delivery.caption:
            lines[0] += f" {delivery.caption}"
        return _LINE_BREAK.sub("\n", "\n".join(lines))
    if saved_path is not None:
        body = f"[document {saved_path}]" + (f" {delivery.caption}" if delivery.caption else "")
    elif delivery.text is not None:
        body = delivery.text
    elif delivery.caption is not None:
        body = delivery.caption
    elif delivery.document is not None:
        file_name = delivery.document.get("fileName")
        body = f"[document {file_name if isinstance(file_name, str) and file_name else 'unnamed'}]"
    else:
        return None
    return _LINE_BREAK.sub("\n", body)


def transcript_text(delivery: Delivery, saved_path: str | None = None, *, context: bool = False) -> str:
    """What a transcribed voice note types (``delivery.transcribed_from``): the transcript, as a
    message the owner wrote (the leader made it one line). With ``context`` the file line follows,
    ``[<kind> <path>]`` (``[<kind> <name>]`` when it was not saved) with the caption after it;
    without, the caption follows on its own line when there is one."""
    lines = [delivery.text or ""]
    file = delivery.transcribed_from or {}
    if context:
        kind = str(file.get("kind") or "voice")
        line = f"[{kind} {saved_path}]" if saved_path is not None else f"[{kind} {file.get('fileName') or 'unnamed'}]"
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
    whom = "the agent" if reply.get("fromAgent") else (reply.get("fromName") or "a message")
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


async def save_document(client: FollowerClient, delivery: Delivery, inbox: str) -> str | None:
    """Download an owner's document into ``inbox`` (``<cwd>/.topicbus/inbox``); None on failure
    (the line then names the document only, so the agent still learns that it was sent)."""
    return await _save(client, delivery.document or {}, delivery, inbox, "document")


async def save_files(client: FollowerClient, delivery: Delivery, inbox: str) -> list[str | None]:
    """Download each file of a ``media`` delivery that can be downloaded (not over 20 MB) into
    ``inbox``; a path per file, None where it was not saved."""
    paths: list[str | None] = []
    for index, file in enumerate(delivery.files or []):
        if file.get("tooLarge"):
            paths.append(None)
            continue
        paths.append(await _save(client, file, delivery, inbox, str(file.get("kind") or "document"), index))
    return paths


async def save_transcribed(client: FollowerClient, delivery: Delivery, inbox: str) -> str | None:
    """Download the file a transcript was made from (``follow --context``); None on failure."""
    file = delivery.transcribed_from or {}
    return await _save(client, file, delivery, inbox, str(file.get("kind") or "voice"))


async def _save(client: FollowerClient, doc: dict, delivery: Delivery, inbox: str, kind: str,
                index: int = 0) -> str | None:
    file_id = doc.get("fileId")
    if not isinstance(file_id, str) or not file_id:
        return None
    name = str(doc.get("fileName") or "")
    if not name:  # voice notes and video notes come without a name: the kind, and the type's extension
        name = kind + (mimetypes.guess_extension(str(doc.get("mimeType") or "")) or "")
    name = _UNSAFE_NAME.sub("_", name).strip(". ") or "document"
    stem = f"{delivery.message_id or delivery.delivery_id}" + (f"-{index + 1}" if index else "")
    path = os.path.join(inbox, f"{stem}-{name[:100]}")
    try:
        data = await client.download_document(file_id)
        os.makedirs(inbox, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    except Exception as exc:  # noqa: BLE001 - the message still reaches the agent
        logger.warning("follow: file {} not saved ({})", file_id, type(exc).__name__)
        return None
    return path
