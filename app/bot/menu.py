"""The command menu Telegram shows in the group (the "/" button and autocompletion).

Menus are per chat, not per topic, so each description says where its command works. The menu is
set with a chat scope (``BotCommandScopeChat``): only the leader's group sees it, not every chat
the bot is in. It is compared with ``getMyCommands`` first and set only when it differs, so a
restart costs one read.
"""

from __future__ import annotations

from enum import StrEnum

from topicbus.core.telegram import CallResult
from topicbus.bot.gateway import TelegramGateway

CONTROL_COMMANDS: tuple[tuple[str, str], ...] = (
    ("status", "Control topic: agents, slots and queued messages"),
    ("cleanup", "Control topic: delete (on) or keep (off) the topics of ended agents"),
    ("mode", "Control topic: how topic titles are shown"),
    ("forget", "Control topic: free the slot of an agent that is gone"),
    ("help", "Control topic: what each command does"),
)
AGENT_COMMANDS: tuple[tuple[str, str], ...] = (
    ("interrupt", "Agent topic: interrupt the agent (like Ctrl-C)"),
    ("kill", "Agent topic: end the agent's process"),
    ("eof", "Agent topic: close the agent's input (like Ctrl-D)"),
    ("screen", "Agent topic: a picture of the agent's terminal (follow --pty)"),
    ("queue", "Agent topic: list messages waiting for an offline agent"),
    ("drop", "Agent topic: discard messages waiting for an offline agent"),
)
COMMAND_MENU: tuple[tuple[str, str], ...] = CONTROL_COMMANDS + AGENT_COMMANDS


class MenuSync(StrEnum):
    SET = "set"
    UNCHANGED = "unchanged"
    FAILED = "failed"


async def sync_command_menu(gateway: TelegramGateway, chat_id: int,
                            menu: tuple[tuple[str, str], ...] = COMMAND_MENU, *,
                            current: CallResult | None = None) -> tuple[MenuSync, str]:
    """Make the group's menu equal ``menu``; set it only when Telegram's differs. ``current`` is
    the ``getMyCommands`` answer when the caller already asked (the leader asks while it checks
    the chat)."""
    if current is None:
        current = await gateway.get_commands(chat_id)
    if current.ok and list(current.value or []) == list(menu):
        return MenuSync.UNCHANGED, ""
    result = await gateway.set_commands(chat_id, menu)
    return (MenuSync.SET, "") if result.ok else (MenuSync.FAILED, f"{result.outcome}: {result.message}")
