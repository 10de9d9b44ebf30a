"""A thread target: where a topic's messages go in Telegram."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Target:
    """A chat plus an optional forum topic id (``None``: the chat itself, e.g. a private chat)."""

    chat_id: int
    thread_id: int | None = None
