"""Slot rotation end to end (docs/operations.md, "Workspace slots and titles"): 26 slots full, preserved dead followers, one victim, one delete."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.e2e.harness import CHAT_ID, Cluster

pytestmark = pytest.mark.e2e

MINIMAL_AGENT = "import sys\nprint('up', flush=True)\nfor line in sys.stdin:\n    print(line.strip(), flush=True)\n"


async def binding(cluster: Cluster, workdir) -> dict | None:
    snap = await cluster.status()
    return next((b for b in snap["bindings"] if b["cwd"] == str(workdir)), None) if snap else None


async def wait_state(cluster: Cluster, workdir, state: str, timeout: float = 30.0) -> dict:
    async def check():
        b = await binding(cluster, workdir)
        return b if b and b["state"] == state else None

    return await cluster.wait_for(check, timeout, f"{workdir} {state}")


async def test_full_capacity_rotation_deletes_only_the_longest_inactive_topic(cluster: Cluster, tmp_path):
    env = {"TOPICBUS_THREAD_CLEANUP": "false", "TOPICBUS_HEARTBEAT_INTERVAL_MS": "300",
           "TOPICBUS_FOLLOWER_STALE_AFTER_MS": "2500"}
    await cluster.start_leader(**env)
    await cluster.wait_polling()
    dirs = [tmp_path / f"agent{i:02d}" for i in range(25)]
    followers = []
    for batch in range(0, 25, 5):
        followers += await asyncio.gather(*(cluster.start_follower(d, script=MINIMAL_AGENT, **env)
                                            for d in dirs[batch:batch + 5]))

    async def all_live():
        snap = await cluster.status()
        return snap and sum(1 for b in snap["bindings"] if b["state"] == "live") == 25

    await cluster.wait_for(all_live, timeout=90, message="25 live followers")
    threads = {d: (await binding(cluster, d))["threadId"] for d in dirs}

    # kill three, one after the other: agent00 has the oldest inactivity proof
    for i in (0, 1, 2):
        os.killpg(followers[i].pid, signal.SIGKILL)
        await followers[i].wait()
        await wait_state(cluster, dirs[i], "preserved")
    snap = await cluster.status()
    assert [r["slot"] for r in snap["rotation"]["rotationOrder"]][:3] == [
        (await binding(cluster, d))["slot"] for d in dirs[:3]]
    victim_slot = (await binding(cluster, dirs[0]))["slot"]
    cluster.fake.reset_calls()

    newcomer = tmp_path / "newcomer"
    await cluster.start_follower(newcomer, script=MINIMAL_AGENT, **env)
    new = await wait_state(cluster, newcomer, "live")
    assert new["slot"] == victim_slot
    deleted = [c.params["message_thread_id"] for c in cluster.fake.calls_to("deleteForumTopic")]
    assert deleted == [threads[dirs[0]]]
    for d in dirs[1:]:
        assert not cluster.fake.topic(CHAT_ID, threads[d]).deleted

    # agent01 was not the victim: restarted with its own cwd it gets its own topic back
    await cluster.start_follower(dirs[1], script=MINIMAL_AGENT, **env)
    assert (await wait_state(cluster, dirs[1], "live"))["threadId"] == threads[dirs[1]]
    await cluster.start_follower(dirs[2], script=MINIMAL_AGENT, **env)
    await wait_state(cluster, dirs[2], "live")

    # every slot is protected now: a further newcomer is refused clearly and nothing is deleted
    refused = await cluster.start_follower(tmp_path / "one-too-many", script=MINIMAL_AGENT, **env)
    await cluster.wait_for(lambda: "protected-capacity" in refused.log(), timeout=20,
                           message="a clear slot refusal in the follower's log")
    assert len(cluster.fake.calls_to("deleteForumTopic")) == 1
    assert await binding(cluster, tmp_path / "one-too-many") is None
