"""Nothing lost at exit (docs/operations.md, "Cleanup policy"): a real leader, real `follow`
processes and the fake Bot API under Telegram's real budget (20 a minute in the group). Every line
and the exit notice reach the topic before any close or delete; a proven death is marked
``⏹ process ended``; the topic stays for its grace period and comes back to a returning agent."""

from __future__ import annotations

import signal
import textwrap

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster

pytestmark = pytest.mark.e2e

TELEGRAM_BUDGET = {  # the real group allowance: the drain has to wait its turn
    "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_MINUTE": "20",
    "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_SECOND": "1",
}

TWO_HUNDRED_LINES_THEN_EXIT_3 = textwrap.dedent("""
    import sys, time
    for n in range(200):
        print(f"line {n:03d}", flush=True)
        time.sleep(0.01)
    sys.exit(3)
""")

SILENT_AGENT = textwrap.dedent("""
    import sys, time
    print("agent ready", flush=True)
    for line in sys.stdin:
        print("got:" + line.rstrip(), flush=True)
""")


def topic_calls(cluster: Cluster, thread: int) -> list[str]:
    return [c.method for c in cluster.fake.calls if c.params.get("message_thread_id") == thread
            or (c.method == "editMessageText" and cluster.fake.message(CHAT_ID, c.params.get("message_id") or 0)
                and cluster.fake.message(CHAT_ID, c.params["message_id"]).get("message_thread_id") == thread)]


async def test_200_lines_then_exit_3_all_arrive_with_the_notice_before_any_close_or_delete(cluster: Cluster,
                                                                                           tmp_path):
    cluster.fake.set_flood_limit(20)  # Telegram answers 429 beyond 20 a minute, as it does
    # The exit notice's first send is lost on the way: the topic backs off and sends it again, and
    # the close still waits for it.
    cluster.fake.drop_next("sendMessage", when=lambda p: "exited with code" in str(p.get("text")))
    await cluster.start_leader(**TELEGRAM_BUDGET)
    await cluster.wait_polling()
    work = tmp_path / "ticker"
    follower = await cluster.start_follower(work, script=TWO_HUNDRED_LINES_THEN_EXIT_3)
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    assert await follower.wait(timeout=60) == 3

    await cluster.wait_for(lambda: cluster.fake.calls_to("deleteForumTopic"), timeout=90,
                           message="the topic deleted after its output")
    calls = topic_calls(cluster, thread)
    closing = calls.index("closeForumTopic")
    assert calls[closing:] == ["closeForumTopic", "deleteForumTopic"], calls
    lines = cluster.lines_in(thread)
    assert [line for line in lines if line.startswith("line ")] == [f"line {n:03d}" for n in range(200)]
    assert lines[-1].startswith("⏹ exited with code 3 after "), lines[-3:]


async def test_a_killed_agent_gets_process_ended_and_its_topic_goes_after_the_grace(cluster: Cluster, tmp_path):
    await cluster.start_leader(TOPICBUS_CLEANUP_GRACE_S="3")
    await cluster.wait_polling()
    work = tmp_path / "doomed"
    follower = await cluster.start_follower(work, script=SILENT_AGENT)
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")

    follower.kill(signal.SIGKILL)  # follow cannot say anything: the leader proves the death
    await cluster.wait_text(thread, "⏹ process ended", timeout=30)
    assert cluster.texts_in(thread)[-1] == "⏹ process ended"
    assert cluster.fake.calls_to("deleteForumTopic") == []  # the owner can still read the end
    await cluster.wait_for(lambda: cluster.fake.calls_to("deleteForumTopic"), timeout=30,
                           message="the topic deleted when its grace ended")
    assert cluster.fake.topic(CHAT_ID, thread).deleted


async def test_an_agent_back_within_the_grace_keeps_its_topic(cluster: Cluster, tmp_path):
    await cluster.start_leader(TOPICBUS_CLEANUP_GRACE_S="600")
    await cluster.wait_polling()
    work = tmp_path / "returning"
    first = await cluster.start_follower(work, script="print('first run', flush=True)")
    assert await first.wait() == 0  # it ran and ended before anyone looked
    [topic] = [t for t in cluster.fake.topics(CHAT_ID) if t.name == "returning"]
    thread = topic.thread_id
    await cluster.wait_text(thread, "⏹ exited with code 0 after ")

    await cluster.start_follower(work, script=SILENT_AGENT)
    assert (await cluster.wait_follower_topic(work))["threadId"] == thread
    await cluster.wait_for(lambda: sum("agent ready" in t for t in cluster.texts_in(thread)), timeout=30,
                           message="the second run in the same topic")
    assert not cluster.fake.topic(CHAT_ID, thread).deleted
    assert cluster.fake.calls_to("closeForumTopic") == [] and cluster.fake.calls_to("deleteForumTopic") == []


LEAVES_ON_CUE = textwrap.dedent("""
    import os, sys, time
    print("agent ready", flush=True)
    while not os.path.exists("cue"):  # a file, not a message: an owner's message would end the stream itself
        time.sleep(0.05)
    print("leaving", flush=True)
    sys.exit(3)
""")


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
async def test_the_exit_notice_is_posted_once_when_the_leader_restarts_before_posting_it(cluster: Cluster,
                                                                                          tmp_path, stop):
    # The agent's last line and follow's exit notice reach the outbox, follow leaves gracefully, and
    # the leader stops before it posted them (Telegram held it back). The next leader posts them as
    # the end of that stream: its last message notifies, and no `✓ ⏹ exited …` line repeats the notice.
    leader = await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = tmp_path / "leaver"
    follower = await cluster.start_follower(work, script=LEAVES_ON_CUE, TOPICBUS_THREAD_CLEANUP="false")
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")
    held = lambda p: p.get("message_thread_id", thread) == thread and "leaving" in str(p.get("text"))  # noqa: E731
    for method in ("sendMessage", "editMessageText"):  # a new message, or the live one grown by an edit
        cluster.fake.fail_next(method, status=429, retry_after=600, when=held)
    (work / "cue").write_text("")
    assert await follower.wait(timeout=30) == 3  # everything handed over; the leader holds it
    await cluster.wait_for(lambda: any("leaving" in str(c.params.get("text")) for c in cluster.fake.calls
                                       if c.status == 429), message="the leader's attempt, refused (429)")
    for method in ("sendMessage", "editMessageText"):
        cluster.fake.clear_faults(method)
    assert "leaving" not in "\n".join(cluster.texts_in(thread))
    leader.kill(stop)
    await leader.wait(timeout=30)

    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_text(thread, "⏹ exited with code 3 after ", timeout=30)
    [notice] = [m for m in cluster.fake.messages_in(CHAT_ID, thread) if "⏹ exited" in (m.text or "")]
    assert notice.silent is False, [(m.text, m.silent) for m in cluster.fake.messages_in(CHAT_ID, thread)]
    assert "leaving" in "\n".join(cluster.texts_in(thread))
    # The last words notified, so nothing is owed: a later quiet period brings no `✓` line. An owner
    # message answered by nobody (the agent is gone) is told so; the topic then holds one exit notice.
    cluster.fake.push_message(CHAT_ID, "anyone?", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "offline", timeout=30)
    assert sum("⏹ exited" in text for text in cluster.texts_in(thread)) == 1, cluster.texts_in(thread)
