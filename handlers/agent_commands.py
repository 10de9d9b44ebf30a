"""Reserved commands in agent topics: /interrupt, /kill, /eof, /screen, /queue, /drop (owners only).

PTB's ``CommandHandler`` does the matching: the command must open the message (Telegram's
``bot_command`` entity at offset 0), with no ``@`` or this bot's ``@username``; ``/kill@otherbot``
and ``//kill`` are not matched and reach the agent as text. Registered in the routing handlers'
group, before them, so a matched command is never routed as a message. Edits never run a command.
"""

from __future__ import annotations

from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes, filters

from topicbus.handlers.filters import InThread, owner_messages
from topicbus.leader.agent_commands import RESERVED_COMMANDS, AgentCommands
from topicbus.leader.routing import InboundBatches
from topicbus.leader.topics import ControlTopic


def register(app: Application, *, commands: AgentCommands, batches: InboundBatches, control: ControlTopic,
             chat_id: int, owner_ids: frozenset[int], group: int = 1) -> None:
    async def reserved(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        if message is None or message.message_thread_id is None or not message.text:
            return
        command = message.text.split(maxsplit=1)[0][1:].split("@", 1)[0].lower()
        await commands.handle(message.chat_id, message.message_thread_id, command, update_id=update.update_id,
                              message_id=message.message_id, typed_at_ms=int(message.date.timestamp() * 1000),
                              batch=batches.current)

    where = (owner_messages(chat_id, owner_ids) & filters.IS_TOPIC_MESSAGE & ~InThread(lambda: control.thread_id)
             & filters.UpdateType.MESSAGE)
    app.add_handler(CommandHandler(list(RESERVED_COMMANDS), reserved, filters=where), group=group)
