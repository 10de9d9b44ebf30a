"""An owner's message in a topic ends the agent's turn there (``OutboundScheduler.owner_spoke``).

A phone shows a topic as one column: if the agent's next output grew its earlier message by an
edit, the answer would appear *above* the owner's question. So any owner message in a topic
(text, file, command) makes the next output a new message below it, which notifies. Runs in its
own group before the others and never stops them.
"""

from __future__ import annotations

from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from topicbus.core.target import Target
from topicbus.handlers.filters import NOT_STATUS_UPDATE, owner_messages
from topicbus.leader.outbound import OutboundScheduler

GROUP = -1  # before routing and commands, which go on regardless


def register(app: Application, *, outbound: OutboundScheduler, chat_id: int, owner_ids: frozenset[int]) -> None:
    where = owner_messages(chat_id, owner_ids) & filters.UpdateType.MESSAGE & NOT_STATUS_UPDATE

    async def spoke(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.effective_message
        if message is not None:
            thread_id = message.message_thread_id if message.is_topic_message else None
            outbound.owner_spoke(Target(message.chat_id, thread_id))

    app.add_handler(MessageHandler(where, spoke), group=GROUP)
