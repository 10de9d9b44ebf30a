"""The bot as a Telegram citizen, with real leader processes against the fake Bot API:
the command menu, the welcome, the hint outside agent topics, and a start-up free of warnings."""

from __future__ import annotations

import re
import signal

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster
from topicbus import __version__
from topicbus.bot.menu import AGENT_COMMANDS, COMMAND_MENU, CONTROL_COMMANDS
from topicbus.handlers.control import help_text
from topicbus.leader.notices import GENERAL_HINT, TOPIC_HINT

pytestmark = pytest.mark.e2e

CHAT_SCOPE = {"type": "chat", "chat_id": CHAT_ID}


async def outbox_drained(cluster: Cluster) -> bool:
    snapshot = await cluster.status()
    return snapshot is not None and snapshot.get("outboxPending") == 0


async def stop_gracefully(cluster: Cluster, proc) -> None:
    # With an idle outbox: on Python 3.11 OutboundSender.stop can lose its cancellation when a
    # send finishes at that very moment (asyncio.wait_for), and the process would not exit.
    await cluster.wait_for(lambda: outbox_drained(cluster), message="the outbox drained")
    proc.kill(signal.SIGTERM)
    assert await proc.wait() == 0, proc.log()


async def test_command_menu_is_set_at_the_first_start_and_not_again_at_a_restart(cluster: Cluster):
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    menu = cluster.fake.commands_for(CHAT_SCOPE)
    assert [c["command"] for c in menu] == [c for c, _ in COMMAND_MENU]
    assert {"status", "cleanup", "mode", "forget", "help"} == {c for c, _ in CONTROL_COMMANDS}
    assert {"interrupt", "kill", "eof", "screen", "queue", "drop"} == {c for c, _ in AGENT_COMMANDS}
    assert cluster.fake.commands == []  # the chat's menu only, not every chat the bot is in
    assert len(cluster.fake.calls_to("setMyCommands")) == 1

    await stop_gracefully(cluster, leader)
    await cluster.start_leader()
    await cluster.wait_polling()
    assert len(cluster.fake.calls_to("getMyCommands")) == 2  # compared at each start...
    assert len(cluster.fake.calls_to("setMyCommands")) == 1  # ...and set only when it differed


async def test_the_welcome_appears_once_per_database_and_an_unclean_stop_is_reported(cluster: Cluster):
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    control = (await cluster.status())["controlThreadId"]
    bus_url = f"ws://127.0.0.1:{cluster.port}/v1/bus"
    await cluster.wait_text(control, f"topicbus follow --leader {bus_url} -- <command>")
    welcome = cluster.texts_in(control)[0]
    assert f"topicbus {__version__}" in welcome and f"Bus: {bus_url}" in welcome and "/help" in welcome

    # A clean restart says nothing: the answer to /help is the next message in the control topic.
    await stop_gracefully(cluster, leader)
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    cluster.fake.push_message(CHAT_ID, "/help", thread_id=control, from_id=OWNER_ID)
    await cluster.wait_for(lambda: len(cluster.texts_in(control)) >= 2, message="the answer to /help")
    assert cluster.texts_in(control)[1] == help_text(0)  # the harness runs with CLEANUP_GRACE_S=0

    # After a crash the next leader says so, in one line, and does not welcome again.
    leader.kill()
    await leader.wait()
    await cluster.start_leader()
    await cluster.wait_polling()
    await cluster.wait_text(control, "leader started (epoch 3)")
    texts = cluster.texts_in(control)
    assert texts[2] == "leader started (epoch 3); the previous leader did not stop cleanly"
    assert sum(text.startswith("👋") for text in texts) == 1


async def test_an_owner_outside_the_agent_topics_gets_one_hint_and_a_stranger_nothing(cluster: Cluster, tmp_path):
    _, _, agent_thread = await cluster.leader_with_follower(tmp_path / "agent")
    fake = cluster.fake

    async def all_handled_and_sent() -> bool:
        """Every update confirmed (its handlers ran, their notices are in the outbox) and the
        outbox drained: nothing is still on its way to the chat."""
        return not fake.pending_updates() and await outbox_drained(cluster)

    fake.push_message(CHAT_ID, "hello?", thread_id=None, from_id=OWNER_ID + 1)  # a stranger in General
    fake.push_message(CHAT_ID, "/status", thread_id=None, from_id=OWNER_ID + 1)
    await cluster.wait_for(all_handled_and_sent, message="the stranger's messages handled")
    assert fake.messages_in(CHAT_ID, None) == []

    fake.push_message(CHAT_ID, "/status", thread_id=None, from_id=OWNER_ID)  # the owner in General
    fake.push_message(CHAT_ID, "hello?", thread_id=None, from_id=OWNER_ID)
    fake.push_topic_event(CHAT_ID, None, "created", "notes", from_id=OWNER_ID)  # a topic no agent holds
    notes = max(t.thread_id for t in fake.topics(CHAT_ID))
    fake.push_message(CHAT_ID, "anyone?", thread_id=notes, from_id=OWNER_ID)
    fake.push_message(CHAT_ID, "still nobody", thread_id=notes, from_id=OWNER_ID)
    fake.push_message(CHAT_ID, "for the agent", thread_id=agent_thread, from_id=OWNER_ID)
    await cluster.wait_text(agent_thread, "echo: for the agent")
    await cluster.wait_for(all_handled_and_sent, message="the owner's messages handled")
    assert [m.text for m in fake.messages_in(CHAT_ID, None)] == [GENERAL_HINT]  # one hint, rate-limited
    assert [m.text for m in fake.messages_in(CHAT_ID, notes)] == [TOPIC_HINT]
    assert not any(text in (GENERAL_HINT, TOPIC_HINT) for text in cluster.texts_in(agent_thread))


async def test_a_leader_start_logs_no_warnings_from_python_or_ptb(cluster: Cluster, tmp_path):
    """Every warning category shown (PYTHONWARNINGS=default also shows deprecations once): a start,
    an agent's round trip and a graceful stop print none, PTBUserWarning included."""
    leader, _, thread = await cluster.leader_with_follower(tmp_path / "quiet", PYTHONWARNINGS="default")
    cluster.fake.push_message(CHAT_ID, "hi", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: hi")
    await stop_gracefully(cluster, leader)
    log = leader.log()
    assert "polling Telegram as leader" in log
    assert "PTBUserWarning" not in log and not re.search(r"\w+Warning: ", log), log
