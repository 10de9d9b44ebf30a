"""A tidy topic: a prompt that comes alone after a program's output joins the output's
message instead of standing alone, and no "✓" line holds only a prompt. A real leader against the
fake Bot API and a real ``topicbus follow`` with a Python program that behaves like a shell."""

from __future__ import annotations

import sys
import textwrap

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster

pytestmark = pytest.mark.e2e

DEADLINE = 30.0
PROMPT = "root@vm:/tmp/shop#"

# Answers a command with a line, shows its prompt after a pause (argv[1] seconds), then prints one
# more line 8 s later. That is the program's own silence, the situation under test (a shell idle at
# its prompt): long enough for the stream to end and a "✓" line to be owed (STREAM_QUIET_S is 1 s
# here; with 3 s "later" still grew the same message). The test itself only waits on conditions.
SHELL_LIKE = textwrap.dedent(f"""
    import sys, time
    print("agent ready", flush=True)
    sys.stdin.readline()
    print("built 3 targets", flush=True)
    time.sleep(float(sys.argv[1]))
    sys.stdout.write("{PROMPT} "); sys.stdout.flush()
    time.sleep(8)
    print("later", flush=True)
    sys.stdin.readline()
""")


@pytest.mark.parametrize("pause_s", ["0.3", "2.0"], ids=["same-stream", "after-the-stream-went-quiet"])
async def test_a_prompt_alone_joins_the_output_message_before_it(cluster: Cluster, pause_s: str):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false", TOPICBUS_STREAM_QUIET_S="1")
    await cluster.wait_polling()
    work = cluster.tmp / "shop"
    work.mkdir()
    await cluster.spawn("follow-shop", ["follow", "--cwd", str(work), "--", sys.executable, "-u", "-c", SHELL_LIKE,
                                        pause_s])
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")
    cluster.fake.push_message(CHAT_ID, "make", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "later", DEADLINE)
    texts = cluster.texts_in(thread)
    assert "built 3 targets\n" + PROMPT in texts, texts  # one message: the output, then its prompt
    assert PROMPT not in texts and f"✓ {PROMPT}" not in texts, texts  # never a message of its own
    answer = next(m for m in cluster.fake.messages_in(CHAT_ID, thread) if m.text == "built 3 targets\n" + PROMPT)
    assert answer.reply_markup is None
