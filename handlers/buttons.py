"""Presses of inline buttons (``callback_query``) → ``leader/buttons``.

Every query is handed over, whoever pressed and whatever it carries: ``leader/buttons`` decides
each and offers its answer to the bounded press-answer lane (strangers and stale presses get an
alert, a stranger at most one a minute; a storm of presses is merged). The handler only extracts;
it never calls Telegram itself (answers go through the lane, edits through the outbound scheduler,
both in the background). A press that reached the agent is the owner's turn, like a message
(``handlers/turns``): the agent's next output starts a new message, which notifies.
"""

from __future__ import annotations

from telegram import Message, MessageEntity, Update
from telegram.ext import Application, CallbackQueryHandler, ContextTypes

from topicbus.core.target import Target
from topicbus.core.formatting import Entity, Rendered
from topicbus.leader.buttons import TURN_OUTCOMES, ButtonPresses, Press
from topicbus.leader.outbound import OutboundScheduler
from topicbus.leader.routing import InboundBatches


def message_as_rendered(message: Message) -> Rendered | None:
    """The pressed message as it reads now: its text (or caption) and entities, as sent again in an edit."""
    text = message.text if message.text is not None else message.caption
    if text is None:
        return None
    entities: tuple[MessageEntity, ...] = message.entities if message.text is not None else message.caption_entities
    return Rendered(text, tuple(Entity(e.type, e.offset, e.length, e.language, e.url) for e in entities or ()))


def register(app: Application, *, presses: ButtonPresses, batches: InboundBatches, outbound: OutboundScheduler,
             owner_ids: frozenset[int], group: int = 0) -> None:
    async def pressed(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        query = update.callback_query
        if query is None:
            return
        message = query.message
        text_message = message if isinstance(message, Message) else None
        thread = text_message.message_thread_id if text_message is not None and text_message.is_topic_message else None
        press = Press(update_id=update.update_id, query_id=query.id, user_id=query.from_user.id,
                      chat_id=message.chat.id if message is not None else None, thread_id=thread,
                      message_id=message.message_id if message is not None else None, data=query.data,
                      message=message_as_rendered(text_message) if text_message is not None else None)
        outcome = await presses.press(press, by_owner=query.from_user.id in owner_ids and not query.from_user.is_bot,
                                      batch=batches.current)
        if outcome in TURN_OUTCOMES and press.chat_id is not None:
            outbound.owner_spoke(Target(press.chat_id, press.thread_id))

    app.add_handler(CallbackQueryHandler(pressed), group=group)
