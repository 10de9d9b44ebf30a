"""The control topic through Telegram (README, "Control topic"): owners' commands answered in the control topic,
bad arguments get a clear answer, strangers are ignored; topic service messages update the store."""

from __future__ import annotations

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster

pytestmark = pytest.mark.e2e


async def test_control_commands_answer_owners_in_the_control_topic(cluster: Cluster, tmp_path):
    work = tmp_path / "ctl-agent"
    _, _, thread = await cluster.leader_with_follower(work)
    control = (await cluster.status())["controlThreadId"]

    async def ask(text: str, expect: str) -> str:
        before = len(cluster.texts_in(control))
        cluster.fake.push_message(CHAT_ID, text, thread_id=control, from_id=OWNER_ID)
        await cluster.wait_for(lambda: len(cluster.texts_in(control)) > before, message=f"answer to {text}")
        answer = cluster.texts_in(control)[before]
        assert expect in answer, answer
        return answer

    board = await ask("/status", "topicbus · leader")
    assert any(line.startswith("B ") and "live" in line for line in board.splitlines())
    await ask("/help", "/forget <slot>")
    await ask("/cleanup maybe", "Usage: /cleanup on|off (currently on)")
    await ask("/cleanup off", "Cleanup is off: when an agent ends, its topic is kept")
    assert (await cluster.status())["cleanupPolicy"] == "off"
    await ask("/mode rainbow", "Usage: /mode")
    await ask("/mode names", "Display mode is now names")
    assert (await cluster.status())["displayMode"] == "names"
    await ask("/forget", "Usage: /forget <slot letter>")
    answer = await ask("/forget B", "still has a running agent, so it is not forgotten")
    assert "send /kill in its topic" in answer and "ctl-agent" in answer  # its title, no internal id

    # a stranger's command is ignored: no answer, nothing changed
    before = len(cluster.texts_in(control))
    cluster.fake.push_message(CHAT_ID, "/cleanup on", thread_id=control, from_id=OWNER_ID + 7)
    cluster.fake.push_message(CHAT_ID, "/status", thread_id=control, from_id=OWNER_ID)
    await cluster.wait_for(lambda: len(cluster.texts_in(control)) > before, message="answer to the owner")
    assert len(cluster.texts_in(control)) == before + 1
    assert (await cluster.status())["cleanupPolicy"] == "off"
    # a command typed in an agent's topic goes to the agent like any message
    cluster.fake.push_message(CHAT_ID, "/status", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: /status")


async def test_topic_service_messages_update_the_store(cluster: Cluster, tmp_path):
    work = tmp_path / "svc-agent"
    _, _, thread = await cluster.leader_with_follower(work)

    async def binding():
        snap = await cluster.status()
        return next(b for b in snap["bindings"] if b["cwd"] == str(work))

    cluster.fake.push_topic_event(CHAT_ID, thread, "closed", from_id=OWNER_ID)
    await cluster.wait_for(lambda: _state(binding, "closed"), message="topic closed recorded")
    cluster.fake.push_topic_event(CHAT_ID, thread, "reopened", from_id=OWNER_ID)
    await cluster.wait_for(lambda: _state(binding, "open"), message="topic reopened recorded")
    cluster.fake.push_topic_event(CHAT_ID, thread, "edited", "My agent", from_id=OWNER_ID)

    async def titled(name: str) -> bool:
        return (await binding())["title"] == name

    await cluster.wait_for(lambda: titled("My agent"), message="owner's rename adopted as the title")
    cluster.fake.push_topic_event(CHAT_ID, thread, "edited", "Someone else's name", from_id=OWNER_ID + 3)
    cluster.fake.push_topic_event(CHAT_ID, thread, "closed", from_id=OWNER_ID)  # processed after the rename
    await cluster.wait_for(lambda: _state(binding, "closed"), message="later event recorded")
    assert await titled("My agent")  # a stranger's rename is not adopted


async def _state(binding, expected: str) -> bool:
    return (await binding())["topicState"] == expected


STUBBORN_AGENT = """
import signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("stubborn ready", flush=True)
for line in sys.stdin:
    print("echo: " + line.rstrip(), flush=True)
"""


async def test_every_agent_command_answers_in_the_control_topic_and_kill_answers_at_once(cluster: Cluster,
                                                                                         tmp_path):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = tmp_path / "stubborn"
    follower = await cluster.start_follower(work, script=STUBBORN_AGENT, TOPICBUS_THREAD_CLEANUP="false")
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "stubborn ready")
    control = (await cluster.status())["controlThreadId"]

    # An agent topic's command typed in the control topic says where it works.
    for command in ("interrupt", "kill", "eof", "queue", "drop"):
        before = len(cluster.texts_in(control))
        cluster.fake.push_message(CHAT_ID, f"/{command}", thread_id=control, from_id=OWNER_ID)
        await cluster.wait_for(lambda: len(cluster.texts_in(control)) > before, message=f"answer to /{command}")
        answer = cluster.texts_in(control)[before]
        assert answer.startswith(f"/{command} works in an agent's topic"), answer
    assert follower.process.returncode is None  # nothing reached the agent

    # /kill answers as soon as it is sent, not only with the exit notice 5 s later.
    cluster.fake.push_message(CHAT_ID, "/kill", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "⏹ killed by SIGKILL", timeout=30)
    texts = cluster.texts_in(thread)
    sent = [i for i, text in enumerate(texts) if "⏳ SIGTERM sent; SIGKILL in 5 s if it does not exit" in text]
    ended = [i for i, text in enumerate(texts) if "⏹ killed by SIGKILL" in text]
    assert len(sent) == 1 and sent[0] < ended[0], texts
