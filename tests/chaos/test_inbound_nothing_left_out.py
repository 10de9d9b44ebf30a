"""The adversarial run (`make chaos`): nothing the owner sends is left out.

One real ``topicbus leader`` against the fake Bot API, followers on the bus speaking the protocol
(``RawAgent`` of the e2e suite):

* **new topics under fire** — ``TOPICBUS_CHAOS_NEW_TOPICS`` (20) followers register at once; the
  moment Telegram creates each topic, the owner writes in it (the update is queued before the
  ``createForumTopic`` answer). Every first message must reach its agent once, with no "belongs to
  no agent" hint and no offline notice;
* **a deep queue** — ``TOPICBUS_CHAOS_QUEUED`` (20,000) messages wait for an offline agent; ``/queue``
  must count every one;
* **long albums** — albums of 12, 30 and 150 parts must reach the agent with every file (150 parts:
  two items, 100 + 50, in order).

The figures are printed (also without ``-s``) and as one ``CHAOS_INBOUND_SUMMARY {json}`` line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster
from tests.e2e.test_inbound import RawAgent, push
from tests.fakebotapi import JSON, FakeBotApi
from topicbus.leader.notices import TOPIC_HINT
from topicbus.leader.offline import OFFLINE_NOTICE

NEW_TOPICS = int(os.environ.get("TOPICBUS_CHAOS_NEW_TOPICS", "20"))
QUEUED = int(os.environ.get("TOPICBUS_CHAOS_QUEUED", "20000"))
ALBUMS = (12, 30, 150)
SETTLE_S = 180.0
FIRST_WORDS_S = 30.0  # a first message not delivered by then is lost (they take well under 1 s)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with FakeBotApi() as fake:
        c = Cluster(fake=fake, tmp=tmp_path, env_overrides={
            "TOPICBUS_LOG_LEVEL": "DEBUG", "TOPICBUS_FOLLOWER_STALE_AFTER_MS": "5000"})
        try:
            yield c
        finally:
            await c.shutdown()


async def new_topics_under_fire(cluster: Cluster, figures: dict[str, Any]) -> None:
    create = getattr(cluster.fake, "_m_createForumTopic")
    pushed_at: dict[int, float] = {}

    def create_then_owner_writes(params: JSON) -> Any:
        topic = create(params)
        thread = topic["message_thread_id"]
        cluster.fake.push_message(CHAT_ID, f"first words in {thread}", thread_id=thread, from_id=OWNER_ID)
        pushed_at[thread] = time.monotonic()
        return topic

    cluster.fake.register_method("createForumTopic", create_then_owner_writes)
    started = time.monotonic()
    agents = await asyncio.gather(*(RawAgent.join(cluster, cluster.tmp / f"new-{i}") for i in range(NEW_TOPICS)))
    figures["newTopicsRegisteredS"] = round(time.monotonic() - started, 2)
    arrived: dict[int, float] = {}

    def all_arrived() -> bool:
        for agent in agents:
            if agent.thread not in arrived and any(i.get("text") == f"first words in {agent.thread}"
                                                   for i in agent.items()):
                arrived[agent.thread] = time.monotonic()
        return len(arrived) == len(agents)

    try:
        with contextlib.suppress(AssertionError):  # a lost one never comes: counted below
            await cluster.wait_for(all_arrived, FIRST_WORDS_S, "first words in every new topic")
        for agent in agents:
            await agent.say("agent here")  # a notice about the first words would come before this
        for agent in agents:
            await cluster.wait_text(agent.thread, "agent here", timeout=SETTLE_S)
        latencies = sorted(arrived[t] - pushed_at[t] for t in arrived)
        figures.update({
            "newTopics": len(agents),
            "newTopicFirstWordsDelivered": sum(1 for a in agents for i in a.items()
                                               if i.get("text") == f"first words in {a.thread}"),
            "newTopicHints": sum(cluster.texts_in(a.thread).count(TOPIC_HINT) for a in agents),
            "newTopicOfflineNotices": sum(cluster.texts_in(a.thread).count(OFFLINE_NOTICE) for a in agents),
            # how many reached the leader before their binding (the race was run), from its DEBUG log
            "newTopicFirstWordsThatWaited": cluster.procs[0].log().count("waited for the registrations running: bound"),
            "newTopicFirstWordsP50S": round(statistics.median(latencies), 3) if latencies else None,
            "newTopicFirstWordsMaxS": round(latencies[-1], 3) if latencies else None,
        })
    finally:
        cluster.fake.register_method("createForumTopic", create)
        for agent in agents:
            await agent.leave()


async def deep_queue(cluster: Cluster, figures: dict[str, Any]) -> None:
    agent = await RawAgent.join(cluster, cluster.tmp / "away")
    thread = agent.thread
    await agent.leave()
    started = time.monotonic()
    for i in range(QUEUED):
        push(cluster, thread, f"queued {i}")

    async def journaled() -> bool:
        snap = await cluster.status()
        return bool(snap) and any(b["threadId"] == thread and b["queued"] == QUEUED for b in snap["bindings"])

    await cluster.wait_for(journaled, SETTLE_S, f"{QUEUED} journaled")
    figures["queuedJournaledS"] = round(time.monotonic() - started, 2)
    asked = time.monotonic()
    push(cluster, thread, "/queue")
    answer = await cluster.wait_for(
        lambda: next((t for t in cluster.texts_in(thread) if "for this agent (offline)" in t), None), SETTLE_S,
        "the /queue answer")
    figures["queueAnswerS"] = round(time.monotonic() - asked, 3)
    figures["queueCounted"] = int(answer.split("\n")[0].split()[1])
    figures["queueQueued"] = QUEUED


async def long_albums(cluster: Cluster, figures: dict[str, Any]) -> None:
    agent = await RawAgent.join(cluster, cluster.tmp / "albums", "media")
    try:
        for parts in ALBUMS:
            before = len(agent.items())
            cluster.fake.push_album(CHAT_ID, [("document", f"album {parts} part {i}".encode()) for i in range(parts)],
                                    thread_id=agent.thread, caption=f"{parts} parts")
            push(cluster, agent.thread, f"after {parts}")
            await cluster.wait_for(lambda: any(i.get("text") == f"after {parts}" for i in agent.items()), SETTLE_S,
                                   f"the album of {parts} and the message after it")
            items = [i for i in agent.items()[before:] if i["type"] == "media"]
            figures[f"album{parts}Items"] = [len(i["files"]) for i in items]
            fetched = [await agent.fetch(f["fileId"]) for i in items for f in i["files"]]
            figures[f"album{parts}FilesWhole"] = sum(1 for n, (status, data) in enumerate(fetched)
                                                     if status == 200 and data == f"album {parts} part {n}".encode())
    finally:
        await agent.leave()


async def test_nothing_the_owner_sends_is_left_out(cluster: Cluster, capsys: pytest.CaptureFixture[str]):
    figures: dict[str, Any] = {}
    await cluster.start_leader()
    await cluster.wait_polling(timeout=60)
    await new_topics_under_fire(cluster, figures)
    await deep_queue(cluster, figures)
    await long_albums(cluster, figures)
    with capsys.disabled():
        print("\n=== topicbus chaos (nothing left out) ===\n"
              + "\n".join(f"{k}: {v}" for k, v in figures.items()), flush=True)
        print("CHAOS_INBOUND_SUMMARY " + json.dumps(figures), flush=True)

    assert figures["newTopicFirstWordsDelivered"] == NEW_TOPICS
    assert figures["newTopicHints"] == 0 and figures["newTopicOfflineNotices"] == 0
    assert figures["queueCounted"] == QUEUED
    for parts in ALBUMS:
        assert sum(figures[f"album{parts}Items"]) == parts and figures[f"album{parts}FilesWhole"] == parts
    assert figures["album150Items"] == [100, 50]
