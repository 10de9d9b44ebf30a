"""Foundation end to end: real leader and follower processes against the fake Bot API."""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, SECRET, TOKEN, Cluster

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
    await cluster.wait_text(thread, "echo: world")  # a multi-line message arrives as its lines
    assert "echo: hello\necho: world" in "\n".join(cluster.texts_in(thread))

    cluster.fake.push_message(CHAT_ID, "bye", thread_id=thread, from_id=OWNER_ID)
    assert await follower.wait() == 3
    leader.kill(signal.SIGTERM)
    assert await leader.wait() == 0
    for proc in (leader, follower):  # DEBUG logging includes every HTTP request: still no secrets
        assert TOKEN not in proc.log() and TOKEN.split(":")[1] not in proc.log()
        assert SECRET not in proc.log()


async def test_follower_restart_reuses_its_topic(cluster: Cluster, tmp_path):
    work = tmp_path / "repo-restart"
    # Within the cleanup grace (600 s unless configured) a restarted agent gets its topic back. The
    # harness's grace of 0 deletes a topic as soon as the death is proven, which would make this a
    # race between the pruner and how fast the second `follow` starts on a loaded machine.
    _, first, thread = await cluster.leader_with_follower(work, TOPICBUS_CLEANUP_GRACE_S="600")

    os.killpg(first.pid, signal.SIGKILL)  # wrapper and agent die at once, no goodbye
    await first.wait()
    second = await cluster.start_follower(work)
    again = await cluster.wait_follower_topic(work)
    assert again["threadId"] == thread
    await cluster.wait_for(lambda: cluster.lines_in(thread).count("agent ready") == 2, message="second agent ready")
    cluster.fake.push_message(CHAT_ID, "ping", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: ping")
    assert len(cluster.fake.calls_to("createForumTopic")) == 2  # control topic + this one, never a duplicate
    assert second.process.returncode is None


async def test_leader_restart_keeps_bindings_and_delivers_messages_sent_while_down(cluster: Cluster, tmp_path):
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    work = tmp_path / "repo-leader-restart"
    await cluster.start_follower(work)
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")

    leader.kill(signal.SIGKILL)
    await leader.wait()
    for i in range(3):
        cluster.fake.push_message(CHAT_ID, f"while down {i}", thread_id=thread, from_id=OWNER_ID)

    await cluster.start_leader()
    await cluster.wait_polling()
    for i in range(3):
        await cluster.wait_text(thread, f"echo: while down {i}")
    lines = cluster.lines_in(thread)
    assert [t for t in lines if t.startswith("echo: while down")] == [f"echo: while down {i}" for i in range(3)]
    assert len(cluster.fake.calls_to("createForumTopic")) == 2
    assert (await cluster.wait_follower_topic(work))["threadId"] == thread


async def test_standby_takes_over_after_sigkill(cluster: Cluster, tmp_path):
    first = await cluster.start_leader()
    await cluster.wait_polling()
    standby = await cluster.start_leader()
    await cluster.wait_for(lambda: "standby" in standby.log() or "cannot bind" in standby.log(),
                           message="second leader waiting as standby")
    work = tmp_path / "repo-standby"
    await cluster.start_follower(work)
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    epoch = (await cluster.status())["epoch"]

    first.kill(signal.SIGKILL)
    await first.wait()
    health = await cluster.wait_polling(timeout=10)
    assert health["epoch"] > epoch
    cluster.fake.push_message(CHAT_ID, "after takeover", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: after takeover")
    assert cluster.fake.conflicts == 0
    assert standby.process.returncode is None


async def test_non_owner_and_bots_are_ignored(cluster: Cluster, tmp_path):
    work = tmp_path / "repo-owner"
    _, _, thread = await cluster.leader_with_follower(work)
    cluster.fake.push_message(CHAT_ID, "from stranger", thread_id=thread, from_id=555)
    cluster.fake.push_message(CHAT_ID, "from a bot", thread_id=thread, from_id=777, is_bot=True)
    cluster.fake.push_message(CHAT_ID, "from owner", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: from owner")
    texts = cluster.texts_in(thread)
    assert not any("stranger" in t or "a bot" in t for t in texts)


async def test_wrong_bus_secret_is_refused(cluster: Cluster, tmp_path):
    await cluster.start_leader()
    await cluster.wait_polling()
    code, _ = cluster.http("/v1/status", secret="wrong-secret")
    assert code == 401
    work = tmp_path / "repo-bad-secret"
    follower = await cluster.start_follower(work, TOPICBUS_BUS_SECRET="definitely-wrong-secret")
    rc = await follower.wait()
    assert rc == 78
    snap = await cluster.status()
    assert all(b["cwd"] != str(work) for b in snap["bindings"])
    assert "definitely-wrong-secret" not in follower.log()


async def test_owner_document_is_saved_for_the_agent_and_only_routed_files_are_served(cluster: Cluster, tmp_path):
    work = tmp_path / "repo-docs"
    _, _, thread = await cluster.leader_with_follower(work)
    content = b"line one\nline two\n" * 100
    cluster.fake.push_message(CHAT_ID, None, thread_id=thread, from_id=OWNER_ID, caption="please read",
                              document={"file_id": "DOCfile_1", "file_name": "notes (v2).txt", "content": content})
    await cluster.wait_text(thread, "echo: [document ")
    line = next(t for t in cluster.lines_in(thread) if t.startswith("echo: [document "))
    path = line[len("echo: [document "):line.index("]")]
    assert path.startswith(str(work / ".topicbus" / "inbox")) and line.endswith("please read")
    assert open(path, "rb").read() == content
    code, _ = cluster.http("/v1/files/SOMEONE_ELSES_FILE")
    assert code == 404  # the bus is not a proxy for arbitrary Telegram files
    code, _ = cluster.http("/v1/files/DOCfile_1", secret="wrong")
    assert code == 401
