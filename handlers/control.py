"""Admin commands in the leader's control topic: /status, /cleanup, /help (owners only)."""

from __future__ import annotations

from typing import Any

from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from app.status import render_board
from handlers.filters import InThread, owner_messages

HELP = (
    "topicbus control topic\n"
    "/status — slots, topics, liveness, heartbeat age, queued messages\n"
    "/cleanup on|off — delete (on) or keep (off) the topic of a follower whose process is proven dead\n"
    "/help — this text"
)


def register(app: Application, runtime: Any, *, chat_id: int, owner_ids: frozenset[int]) -> None:
    where = owner_messages(chat_id, owner_ids) & InThread(lambda: runtime.control_thread_id)

    async def status(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await update.effective_message.reply_text(render_board(await runtime.status_snapshot()))

    async def cleanup(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        args = [a.lower() for a in context.args or []]
        if args not in (["on"], ["off"]):
            current = await runtime.cleanup_policy()
            shown = {True: "on", False: "off", None: "unknown"}[current]
            await update.effective_message.reply_text(f"Usage: /cleanup on|off (currently {shown}).")
            return
        await runtime.set_cleanup_policy(args[0] == "on")
        await update.effective_message.reply_text(
            "Thread cleanup is on: topics of followers proven dead are deleted." if args[0] == "on" else
            "Thread cleanup is off: topics of followers proven dead are kept and detached.")

    async def help_(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await update.effective_message.reply_text(HELP)

    app.add_handler(CommandHandler("status", status, filters=where), group=0)
    app.add_handler(CommandHandler("cleanup", cleanup, filters=where), group=0)
    app.add_handler(CommandHandler("help", help_, filters=where), group=0)
