"""What `topicbus follow` types into the child for each owner message, document and button press."""

from __future__ import annotations

import os
import re

from loguru import logger

from topicbus.follower.client import FollowerClient
from topicbus.follower.model import Delivery

__all__ = ["INBOX_DIR", "delivery_input", "delivery_text", "save_document"]

INBOX_DIR = os.path.join(".topicbus", "inbox")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")
_LINE_BREAK = re.compile(r"\r\n|\r")
_COMPOUND = re.compile(r"\s*(async\s+)?(for|while|if|with|def|class|try|match)\b.*:")


def delivery_text(delivery: Delivery, saved_path: str | None = None) -> str | None:
    """The text one delivery types (without the final newline), or None when it carries nothing.

    The text, else the caption, else ``[document <fileName>]``; a multi-line message keeps its line
    breaks (``\\r\\n`` and ``\\r`` become ``\\n``), nothing else is changed. A document saved to disk
    is announced first as ``[document <path>]``, followed by the caption when there is one."""
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
    doc = delivery.document or {}
    file_id = doc.get("fileId")
    if not isinstance(file_id, str) or not file_id:
        return None
    name = _UNSAFE_NAME.sub("_", str(doc.get("fileName") or "document")).strip(". ") or "document"
    path = os.path.join(inbox, f"{delivery.message_id or delivery.delivery_id}-{name[:100]}")
    try:
        data = await client.download_document(file_id)
        os.makedirs(inbox, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    except Exception as exc:  # noqa: BLE001 - the message still reaches the agent
        logger.warning("follow: document {} not saved ({})", file_id, type(exc).__name__)
        return None
    return path
