"""python-telegram-bot handlers, one module per feature; ``register_all`` only wires them.

Each feature's ``register`` receives exactly the use cases it calls, by name (as aiogram injects
dependencies): the handlers filter, extract and call; they hold no state of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from telegram.ext import Application

from topicbus.handlers import agent_commands, buttons, control, outside, topic_events, topic_messages, turns

if TYPE_CHECKING:
    from topicbus.leader.assembly import LeaderServices


def register_all(app: Application, services: LeaderServices, *, chat_id: int, owner_ids: frozenset[int]) -> None:
    turns.register(app, outbound=services.outbound, chat_id=chat_id, owner_ids=owner_ids)
    topic_events.register(app, topics=services.topics, chat_id=chat_id, owner_ids=owner_ids)
    control.register(app, desk=services.control_desk, status=services.status, control=services.control,
                     notices=services.notices, chat_id=chat_id, owner_ids=owner_ids)
    # Same group as the routing handlers and before them: a reserved command is never routed.
    agent_commands.register(app, commands=services.agent_commands, batches=services.batches, control=services.control,
                            chat_id=chat_id, owner_ids=owner_ids)
    topic_messages.register(app, router=services.router, batches=services.batches, control=services.control,
                            chat_id=chat_id, owner_ids=owner_ids)
    outside.register(app, notices=services.notices, control=services.control, chat_id=chat_id, owner_ids=owner_ids)
    buttons.register(app, presses=services.buttons, batches=services.batches, outbound=services.outbound,
                     owner_ids=owner_ids)
