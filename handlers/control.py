"""Admin commands in the leader's control topic: /status, /cleanup, /mode, /forget, /help (owners only).

An agent topic's reserved command (/interrupt, /kill, /eof, /screen, /queue, /drop) typed here is answered
with where it works (:func:`elsewhere_text`): it acts on one agent, so it belongs in that agent's topic."""

from __future__ import annotations

from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from topicbus.core.board import render_board
from topicbus.core.display import DisplayMode
from topicbus.handlers.filters import InThread, owner_messages
from topicbus.leader.agent_commands import RESERVED_COMMANDS
from topicbus.leader.control import ControlDesk, DisplayModeRefused
from topicbus.leader.notices import Notices
from topicbus.leader.status import StatusView
from topicbus.leader.topics import ControlTopic
from topicbus.core.admission import AdmissionBlocked

def deletion_rules(grace_s: float) -> str:
    """When a topic is deleted, as /help and /cleanup say it (the grace is TOPICBUS_CLEANUP_GRACE_S)."""
    grace = f"{grace_s / 60:g} min" if grace_s >= 60 else f"{grace_s:g} s"
    after = (f"once its output is posted and {grace} have passed without it coming back" if grace_s > 0
             else "once its output is posted")
    return (
        "A topic is deleted only\n"
        "• with cleanup on, when its agent ends: its program exits or its process dies on the leader's computer "
        f"(seen as soon as it falls silent), {after}; or at once when you /forget its slot;\n"
        "• when all 26 slots are taken and a new agent needs one: the topic idle longest (no agent, nothing "
        "queued) makes room, even one still in its grace time.\n"
        "With cleanup off an ended agent's topic is kept. Silence alone, a leader restart, or an agent that fell "
        "silent before it died never delete a topic (/forget releases it)."
    )


def help_text(grace_s: float) -> str:
    return (
        "topicbus control topic\n"
        "/status — agents, slots, titles, heartbeat age, queued messages\n"
        "/cleanup on|off — delete (on) or keep (off) the topic of an agent that ends\n"
        "/mode names|letters|directory-snake|directory-title — how topic titles are shown\n"
        "/forget <slot> — an agent is gone but still counted: end it like one that exited\n"
        "/help — this text\n"
        "In an agent's topic, /interrupt (Ctrl-C), /kill, /eof (end of input), /screen (a picture of its "
        "terminal), /queue and /drop act on the agent; everything else goes to it, and //text sends the "
        "literal /text.\n\n" + deletion_rules(grace_s)
    )


AGENT_COMMAND_EFFECTS = {
    "interrupt": "interrupts that agent's program (Ctrl-C)",
    "kill": "ends that agent's program (SIGTERM, then SIGKILL after 5 s)",
    "eof": "closes that agent's input (Ctrl-D)",
    "screen": "sends a picture of that agent's terminal (an agent started with follow --pty)",
    "queue": "lists the messages waiting for that agent",
    "drop": "discards the messages waiting for that agent",
}


def elsewhere_text(command: str) -> str:
    """The answer to an agent topic's command typed in the control topic: where it works."""
    return (f"/{command} works in an agent's topic: type it there, and it {AGENT_COMMAND_EFFECTS[command]}. "
            "Here: /status, /cleanup, /mode, /forget, /help.")


def register(app: Application, *, desk: ControlDesk, status: StatusView, control: ControlTopic, notices: Notices,
             chat_id: int, owner_ids: frozenset[int]) -> None:
    """Answers go to the control topic through the outbox (``notices.answer``): no Telegram call runs
    inside the poll loop. Commands whose work calls Telegram (``/mode`` edits titles, ``/forget`` may
    delete a topic) are PTB handlers with ``block=False``: PTB runs each as a task of its own (awaited
    by ``Application.stop``) and the poller goes on with the next update; they answer when they are
    done. The Application keeps ``concurrent_updates`` at 1 (and the poller hands it one update at a
    time): only these handlers run beside the poll loop."""
    where = owner_messages(chat_id, owner_ids) & InThread(lambda: control.thread_id)
    answer = notices.answer  # (text, *, fmt=None)
    grace_s = desk.cleanup_grace_ms / 1000

    async def status_(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await answer(render_board(await status.snapshot()), fmt="pre")

    async def cleanup(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        args = [a.lower() for a in context.args or []]
        if args not in (["on"], ["off"]):
            current = await desk.preferences.cleanup_policy()
            shown = {True: "on", False: "off", None: "unknown"}[current]
            await answer(f"Usage: /cleanup on|off (currently {shown}).\n\n{deletion_rules(grace_s)}")
            return
        await desk.set_cleanup_policy(args[0] == "on")
        await answer("Cleanup is on: when an agent ends (its program exits, its process dies on the leader's "
                     "computer, or you /forget its slot), its topic is deleted, after its output and "
                     "the grace time (see /help)." if args[0] == "on" else
                     "Cleanup is off: when an agent ends, its topic is kept and detached; the agent gets it back "
                     "when it returns.")

    async def mode(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        args = context.args or []
        valid = [m.value for m in DisplayMode]
        if len(args) != 1 or args[0].lower() not in valid:
            await answer(f"Usage: /mode {'|'.join(valid)} (currently {desk.preferences.display_mode}).")
            return
        wanted = DisplayMode(args[0].lower())
        try:
            changed = await desk.set_display_mode(wanted)
        except DisplayModeRefused as exc:
            await answer(str(exc))
        except AdmissionBlocked as exc:
            await answer(f"{exc} Try again in a moment.")
        else:
            await answer(f"Display mode is now {wanted} ({changed} titles changed).")

    async def forget(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        args = context.args or []
        if len(args) != 1 or len(args[0]) != 1 or not args[0].isalpha():
            await answer("Usage: /forget <slot letter>, e.g. /forget C (/status lists the slots)")
            return
        try:
            text = await desk.forget_slot(args[0])
        except AdmissionBlocked as exc:
            text = f"{exc} Try again in a moment."
        await answer(text)

    async def help_(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await answer(help_text(grace_s))

    app.add_handler(CommandHandler("status", status_, filters=where), group=0)
    app.add_handler(CommandHandler("cleanup", cleanup, filters=where), group=0)
    app.add_handler(CommandHandler("mode", mode, filters=where, block=False), group=0)
    app.add_handler(CommandHandler("forget", forget, filters=where, block=False), group=0)
    app.add_handler(CommandHandler("help", help_, filters=where), group=0)

    async def elsewhere(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        if message is None or not message.text:
            return
        await answer(elsewhere_text(message.text.split(maxsplit=1)[0][1:].split("@", 1)[0].lower()))

    app.add_handler(CommandHandler(list(RESERVED_COMMANDS), elsewhere, filters=where), group=0)
