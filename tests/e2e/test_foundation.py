"""Foundation end to end: real leader and follower processes against the fake Bot API."""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster

pytestmark = pytest.mark.e2e


async def test_topic_created_and_echo_round_trip(cluster: Cluster, tmp_path):
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    work = tmp_path / "repo-one"
    follower = await cluster.start_follower(work)
    binding = await cluster.wait_follower_topic(work)
    thread = binding["threadId"]
    topic = cluster.fake.topic(CHAT_ID, thread)
    assert topic is not None and not topic.deleted
    await cluster.wait_text(thread, "agent ready")

    cluster.fake.push_message(CHAT_ID, "hello\nworld", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: hello world")

    cluster.fake.push_message(CHAT_ID, "bye", thread_id=thread, from_id=OWNER_ID)
    assert await follower.wait() == 3
    leader.kill(signal.SIGTERM)
    assert await leader.wait() == 0
