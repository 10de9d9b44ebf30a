"""The bot as a Telegram citizen (issue 13), with real leader processes against the fake Bot API:
the command menu, the welcome, the hint outside agent topics, and a start-up free of warnings."""

from __future__ import annotations

import signal

import pytest

from tests.e2e.harness import CHAT_ID, Cluster
from topicbus.bot.menu import AGENT_COMMANDS, COMMAND_MENU, CONTROL_COMMANDS

pytestmark = pytest.mark.e2e

CHAT_SCOPE = {"type": "chat", "chat_id": CHAT_ID}


async def stop_gracefully(cluster: Cluster, proc) -> None:
    proc.kill(signal.SIGTERM)
    assert await proc.wait() == 0, proc.log()


async def test_command_menu_is_set_at_the_first_start_and_not_again_at_a_restart(cluster: Cluster):
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    menu = cluster.fake.commands_for(CHAT_SCOPE)
    assert [c["command"] for c in menu] == [c for c, _ in COMMAND_MENU]
    assert {"status", "cleanup", "mode", "forget", "help"} == {c for c, _ in CONTROL_COMMANDS}
    assert {"interrupt", "kill", "eof", "queue", "drop"} == {c for c, _ in AGENT_COMMANDS}
    assert cluster.fake.commands == []  # the chat's menu only, not every chat the bot is in
    assert len(cluster.fake.calls_to("setMyCommands")) == 1

    await stop_gracefully(cluster, leader)
    await cluster.start_leader()
    await cluster.wait_polling()
    assert len(cluster.fake.calls_to("getMyCommands")) == 2  # compared at each start...
    assert len(cluster.fake.calls_to("setMyCommands")) == 1  # ...and set only when it differed
