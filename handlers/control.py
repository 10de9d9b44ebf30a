"""Admin commands in the leader's control topic: /status, /cleanup, /mode, /forget, /help (owners only)."""

from __future__ import annotations

from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from topicbus.core.board import render_board
from topicbus.core.display import DisplayMode
from topicbus.handlers.filters import InThread, owner_messages
from topicbus.leader.control import ControlDesk, DisplayModeRefused
from topicbus.leader.status import StatusView
from topicbus.leader.topics import ControlTopic
from topicbus.storage.admission import AdmissionBlocked

HELP = (
    "topicbus control topic\n"
    "/status — slots, topics, liveness, heartbeat age, queued messages\n"
    "/cleanup on|off — delete (on) or keep (off) the topic of a follower whose process is proven dead\n"
    "/mode letters|names|directory-snake|directory-title — how topic titles are shown\n"
    "/forget <slot> — you know that slot's agent is gone: treat it like a proven death\n"
    "/help — this text"
)


def register(app: Application, *, desk: ControlDesk, status: StatusView, control: ControlTopic, chat_id: int,
             owner_ids: frozenset[int]) -> None:
    where = owner_messages(chat_id, owner_ids) & InThread(lambda: control.thread_id)
    board = status

    async def status_(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await update.effective_message.reply_text(render_board(await board.snapshot()))

    async def cleanup(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        args = [a.lower() for a in context.args or []]
        if args not in (["on"], ["off"]):
            current = await desk.preferences.cleanup_policy()
            shown = {True: "on", False: "off", None: "unknown"}[current]
            await update.effective_message.reply_text(f"Usage: /cleanup on|off (currently {shown}).")
            return
        await desk.set_cleanup_policy(args[0] == "on")
        await update.effective_message.reply_text(
            "Thread cleanup is on: topics of followers proven dead are deleted." if args[0] == "on" else
            "Thread cleanup is off: topics of followers proven dead are kept and detached.")

    async def mode(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        args = context.args or []
        valid = [m.value for m in DisplayMode]
        if len(args) != 1 or args[0].lower() not in valid:
            await update.effective_message.reply_text(
                f"Usage: /mode {'|'.join(valid)} (currently {desk.preferences.display_mode}).")
            return
        try:
            changed = await desk.set_display_mode(DisplayMode(args[0].lower()))
        except DisplayModeRefused as exc:
            await update.effective_message.reply_text(str(exc))
            return
        except AdmissionBlocked as exc:
            await update.effective_message.reply_text(f"{exc} Try again in a moment.")
            return
        await update.effective_message.reply_text(f"Display mode is now {args[0].lower()} ({changed} titles changed).")

    async def forget(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        args = context.args or []
        if len(args) != 1 or len(args[0]) != 1 or not args[0].isalpha():
            await update.effective_message.reply_text("Usage: /forget <slot letter>, e.g. /forget C")
            return
        try:
            answer = await desk.forget_slot(args[0])
        except AdmissionBlocked as exc:
            answer = f"{exc} Try again in a moment."
        await update.effective_message.reply_text(answer)

    async def help_(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await update.effective_message.reply_text(HELP)

    app.add_handler(CommandHandler("status", status_, filters=where), group=0)
    app.add_handler(CommandHandler("cleanup", cleanup, filters=where), group=0)
    app.add_handler(CommandHandler("mode", mode, filters=where), group=0)
    app.add_handler(CommandHandler("forget", forget, filters=where), group=0)
    app.add_handler(CommandHandler("help", help_, filters=where), group=0)
