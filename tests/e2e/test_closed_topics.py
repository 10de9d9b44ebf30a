"""A failed delete followed by restarts, with real processes: cleanup is on, one
deleteForumTopic fails with a 5xx, the agent is SIGKILLed and started again in the same directory.
It gets its topic back open (reopened), its output is posted, and a leader restart keeps it open."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster


async def test_an_agent_restarted_after_a_failed_delete_talks_in_an_open_topic(cluster: Cluster, tmp_path: Path):
    work = tmp_path / "agent"
    leader, follower, thread = await cluster.leader_with_follower(work)
    cluster.fake.fail_next("deleteForumTopic", status=500, description="Internal Server Error")
    os.killpg(follower.pid, signal.SIGKILL)  # the wrapper and its agent
    await follower.wait()

    async def delete_failed():
        snapshot = await cluster.status()
        return (snapshot and any(c["threadId"] == thread and c["lastError"] for c in snapshot["pendingCleanups"])
                and [c.status for c in cluster.fake.calls_to("deleteForumTopic")] == [500])

    # Pruned after FOLLOWER_STALE_AFTER_MS (1.5 s in the harness), proven dead, closed, delete failed.
    await cluster.wait_for(delete_failed, 20, "the cleanup intent kept after the failed delete")
    assert cluster.fake.topic(CHAT_ID, thread).closed

    await cluster.start_follower(work)
    await cluster.wait_for(lambda: sum("agent ready" in t for t in cluster.texts_in(thread)) == 2, 20,
                           lambda: f"the restarted agent's output in its topic: {cluster.texts_in(thread)}")
    assert not cluster.fake.topic(CHAT_ID, thread).closed
    cluster.fake.push_message(CHAT_ID, "hello again", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: hello again")

    leader.kill(signal.SIGTERM)
    assert await leader.wait() == 0
    await cluster.start_leader()
    await cluster.wait_polling()
    await cluster.wait_follower_topic(work)
    cluster.fake.push_message(CHAT_ID, "after the leader restart", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: after the leader restart")
    topic = cluster.fake.topic(CHAT_ID, thread)
    assert not topic.closed and not topic.deleted
    assert not (await cluster.status())["pendingCleanups"]
    assert [c.status for c in cluster.fake.calls_to("deleteForumTopic")] == [500]
