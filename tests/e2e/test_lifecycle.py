"""Follower lifecycle end to end: pruning, death proof, cleanup or preservation (docs/operations.md, "Follower lifecycle")."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster

pytestmark = pytest.mark.e2e


def binding_for(snapshot, workdir):
    return next((b for b in snapshot["bindings"] if b["cwd"] == str(workdir)), None)


async def wait_state(cluster: Cluster, workdir, state: str, timeout: float = 20.0):
    async def check():
        snap = await cluster.status()
        b = binding_for(snap, workdir) if snap else None
        return b if b and b["state"] == state else None

    return await cluster.wait_for(check, timeout, f"binding of {workdir} in state {state}")


async def test_sigkilled_follower_is_pruned_and_its_topic_deleted_once(cluster: Cluster, tmp_path):
    work = tmp_path / "killed"
    _, follower, thread = await cluster.leader_with_follower(work)

    os.killpg(follower.pid, signal.SIGKILL)
    await follower.wait()
    await wait_state(cluster, work, "deleted")
    await cluster.wait_for(lambda: cluster.fake.topic(CHAT_ID, thread).deleted, message="topic deleted")
    deletes = [c for c in cluster.fake.calls_to("deleteForumTopic") if c.params.get("message_thread_id") == thread]
    assert len(deletes) == 1
    snap = await cluster.status()
    assert all(f["bindingKey"] != binding_for(snap, work)["bindingKey"] for f in snap["followers"])
    assert snap["pendingCleanups"] == []


async def test_cleanup_off_preserves_topic_and_restart_gets_it_back(cluster: Cluster, tmp_path):
    work = tmp_path / "preserved"
    _, follower, thread = await cluster.leader_with_follower(work, TOPICBUS_THREAD_CLEANUP="false")

    os.killpg(follower.pid, signal.SIGKILL)
    await follower.wait()
    preserved = await wait_state(cluster, work, "preserved")
    assert preserved["inactiveSinceMs"] is not None
    assert not cluster.fake.topic(CHAT_ID, thread).deleted
    assert cluster.fake.calls_to("deleteForumTopic") == [] and cluster.fake.calls_to("closeForumTopic") == []

    # topicbus status (the real command) shows the preserved binding
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "topicbus", "status", "--json"],
                                  capture_output=True, text=True, env=cluster.env(), timeout=20)
    assert out.returncode == 0, out.stderr
    assert binding_for(json.loads(out.stdout), work)["state"] == "preserved"

    await cluster.start_follower(work)
    back = await wait_state(cluster, work, "live")
    assert back["threadId"] == thread
    assert back["inactiveSinceMs"] is None
    await cluster.wait_for(lambda: cluster.lines_in(thread).count("agent ready") == 2, message="second start")
    cluster.fake.push_message(CHAT_ID, "welcome back", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: welcome back")


async def test_stopped_but_alive_follower_is_pruned_and_never_deleted(cluster: Cluster, tmp_path):
    work = tmp_path / "sigstop"
    _, follower, thread = await cluster.leader_with_follower(work)
    witness_work = tmp_path / "witness"
    witness = await cluster.start_follower(witness_work)
    witness_thread = (await cluster.wait_follower_topic(witness_work))["threadId"]

    def deletes_of(thread_id: int) -> list:
        return [c for c in cluster.fake.calls_to("deleteForumTopic") if c.params.get("message_thread_id") == thread_id]

    os.killpg(follower.pid, signal.SIGSTOP)
    try:
        await wait_state(cluster, work, "offline")  # pruned from routing, owner record kept
        snap = await cluster.status()
        assert len(snap["pendingObservations"]) == 1
        # A witness killed now is found stale (1.5 s), proven dead and deleted by prune passes that
        # come later (one every 0.2 s). Once its topic is gone, those passes have also probed the
        # stopped follower many times, and none of them deleted it.
        os.killpg(witness.pid, signal.SIGKILL)
        await witness.wait()
        await cluster.wait_for(lambda: deletes_of(witness_thread), message="the witness's topic deleted")
        assert not cluster.fake.topic(CHAT_ID, thread).deleted
        assert deletes_of(thread) == []
    finally:
        os.killpg(follower.pid, signal.SIGCONT)
    back = await wait_state(cluster, work, "live")
    assert back["threadId"] == thread
    cluster.fake.push_message(CHAT_ID, "still there?", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: still there?")
    assert deletes_of(thread) == []


async def test_follower_that_died_while_the_leader_was_down_is_still_cleaned_up(cluster: Cluster, tmp_path):
    work = tmp_path / "died-during-outage"
    leader, follower, thread = await cluster.leader_with_follower(work)

    leader.kill(signal.SIGKILL)
    await leader.wait()
    os.killpg(follower.pid, signal.SIGKILL)
    await follower.wait()

    await cluster.start_leader()
    await cluster.wait_polling()
    await wait_state(cluster, work, "deleted")  # restored roster → stale → death proven → cleanup
    deletes = [c for c in cluster.fake.calls_to("deleteForumTopic") if c.params.get("message_thread_id") == thread]
    assert len(deletes) == 1


TICKING_AGENT = "import time\nprint('agent ready', flush=True)\ni = 0\nwhile True:\n    i += 1\n    print(f'tick {i}', flush=True)\n    time.sleep(0.3)\n"


async def test_topic_deleted_in_telegram_is_recreated_and_output_continues_there(cluster: Cluster, tmp_path):
    await cluster.start_leader()
    await cluster.wait_polling()
    work = tmp_path / "deleted-by-user"
    await cluster.start_follower(work, script=TICKING_AGENT)
    old = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(old, "tick 2")
    cluster.fake.user_delete_topic(CHAT_ID, old)  # someone deletes the topic in the Telegram app

    async def new_topic():
        snap = await cluster.status()
        b = binding_for(snap, work) if snap else None
        return b if b and b["state"] == "live" and b["threadId"] not in (None, old) else None

    fresh = await cluster.wait_for(new_topic, timeout=30, message="a re-created topic")
    await cluster.wait_for(lambda: any(t.startswith("tick") for t in cluster.lines_in(fresh["threadId"])),
                           message="output flowing into the new topic")
    assert len([t for t in cluster.fake.topics(CHAT_ID) if not t.deleted]) == 2  # control + the new one
