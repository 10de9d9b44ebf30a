"""python-telegram-bot handlers, one module per feature; ``register_all`` only wires them."""

from __future__ import annotations

from typing import Any

from telegram.ext import Application

from topicbus.handlers import control, topic_events, topic_messages


def register_all(app: Application, runtime: Any, *, chat_id: int, owner_ids: frozenset[int]) -> None:
    topic_events.register(app, runtime, chat_id=chat_id, owner_ids=owner_ids)
    control.register(app, runtime, chat_id=chat_id, owner_ids=owner_ids)
    topic_messages.register(app, runtime, chat_id=chat_id, owner_ids=owner_ids)
