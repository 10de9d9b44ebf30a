"""Nothing the owner sends is left out, end to end: a real ``topicbus leader``
process against the fake Bot API, followers on the bus speaking the protocol (``RawAgent``).

* ``/queue`` counts every message that waits (5,000 of them), not the first 1,000;
* a message in a new topic, sent before the leader has bound it, reaches the agent once;
* an album of 12 parts (more than Telegram's 10) reaches the agent as one item with 12 files.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster
from tests.e2e.test_inbound import RawAgent, leader, push
from tests.fakebotapi import JSON
from topicbus.leader.notices import TOPIC_HINT
from topicbus.leader.offline import OFFLINE_NOTICE

pytestmark = pytest.mark.e2e

HOLD_S = 15.0  # longest the fake holds a createForumTopic answer (released as soon as the leader acts)


async def test_queue_counts_all_5000_waiting_messages_and_lists_the_oldest(cluster: Cluster):
    await leader(cluster)
    agent = await RawAgent.join(cluster, cluster.tmp / "away")
    thread = agent.thread
    await agent.leave()
    for i in range(5000):
        push(cluster, thread, f"message {i}")

    async def all_journaled() -> bool:  # /v1/status counts them all: the leader has them
        snap = await cluster.status()
        return bool(snap) and any(b["threadId"] == thread and b["queued"] == 5000 for b in snap["bindings"])

    await cluster.wait_for(all_journaled, timeout=120, message="/v1/status to count 5000 queued messages")
    push(cluster, thread, "/queue")
    answer = await cluster.wait_for(lambda: next((t for t in cluster.texts_in(thread) if "wait" in t
                                                  and "for this agent (offline)" in t), None),
                                    timeout=60, message=lambda: f"the /queue answer in {cluster.texts_in(thread)}")
    lines = answer.split("\n")
    assert lines[0] == "📥 5000 messages wait for this agent (offline):", lines[0]
    assert [line.split(": ", 1)[1] for line in lines[1:16]] == [f"message {i}" for i in range(15)]
    assert lines[16] == "… and 4985 more"
    assert lines[17].startswith("/drop discards them.")


async def test_a_message_in_a_new_topic_before_it_is_bound_reaches_the_agent_once(cluster: Cluster):
    await leader(cluster)
    (leader_proc,) = cluster.procs
    create = getattr(cluster.fake, "_m_createForumTopic")
    pushed: list[JSON] = []

    async def create_then_owner_writes(params: JSON) -> Any:
        """Telegram creates the topic and the owner writes in it at once; the update can be handed
        out before the leader has the answer. The answer is held until the leader has dealt with
        that update without the binding: it confirmed it (a leader that drops it, at once), or it
        logs that the message waits for the registration."""
        topic = create(params)
        if params.get("name") != "topicbus control":
            thread = topic["message_thread_id"]
            pushed.append(cluster.fake.push_message(CHAT_ID, "first words", thread_id=thread, from_id=OWNER_ID))
            update_id = pushed[-1]["update_id"]
            waits = f"a message in thread {thread} waits for the registrations running"
            with contextlib.suppress(AssertionError):  # then the test fails below, with the whole story
                await cluster.fake.wait_for(
                    lambda: waits in leader_proc.log()
                    or all(u["update_id"] != update_id for u in cluster.fake.pending_updates()), timeout=HOLD_S)
        return topic

    cluster.fake.register_method("createForumTopic", create_then_owner_writes)
    agent = await RawAgent.join(cluster, cluster.tmp / "new")
    try:
        assert pushed and pushed[0]["message"]["message_thread_id"] == agent.thread
        push(cluster, agent.thread, "second words")
        items = await agent.wait_items(2)
        assert [i.get("text") for i in items] == ["first words", "second words"]
        await agent.ack_all()
        await agent.say("agent here")  # the topic's output is in order: a notice about them comes first
        await cluster.wait_text(agent.thread, "agent here")
        texts = cluster.texts_in(agent.thread)
        assert TOPIC_HINT not in texts and OFFLINE_NOTICE not in texts, texts
        assert [i.get("text") for i in agent.items()] == ["first words", "second words"]  # once each
        # The race was run: the first words reached the leader before their topic was bound.
        assert f"a message in thread {agent.thread} waited for the registrations running: bound" in leader_proc.log()
    finally:
        await agent.leave()


async def test_an_album_of_12_parts_reaches_the_agent_as_one_item_with_12_files(cluster: Cluster):
    await leader(cluster)
    agent = await RawAgent.join(cluster, cluster.tmp / "album", "media")
    try:
        contents = [f"part {i} bytes".encode() for i in range(12)]
        cluster.fake.push_album(CHAT_ID, [("photo" if i % 2 else "document", data) for i, data in enumerate(contents)],
                                thread_id=agent.thread, caption="twelve")
        push(cluster, agent.thread, "after the album")
        album, after = await agent.wait_items(2)
        assert album["type"] == "media" and album["caption"] == "twelve"
        assert len(album["files"]) == 12
        assert [await agent.fetch(f["fileId"]) for f in album["files"]] == [(200, data) for data in contents]
        assert after.get("text") == "after the album"
        assert len(agent.items()) == 2
    finally:
        await agent.leave()
