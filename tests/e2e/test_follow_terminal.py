"""`topicbus follow` end to end: a real leader against the fake Bot API, real follow processes, real
programs (a Python script, Python's REPL on a pty): what the topic shows."""

from __future__ import annotations

import sys
import textwrap

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster

pytestmark = pytest.mark.e2e

AGENT = textwrap.dedent("""
    import sys
    print("agent ready", flush=True)
    for line in sys.stdin:
        line = line.rstrip("\\n")
        if line == "bye":
            sys.exit(3)
        if line.startswith("err"):
            print("error: " + line, file=sys.stderr, flush=True)
            continue
        print("got:" + line, flush=True)
""")


async def test_lines_stderr_and_the_exit_notice_in_the_topic(cluster: Cluster, tmp_path):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = tmp_path / "repo-terminal"
    follower = await cluster.start_follower(work, script=AGENT, TOPICBUS_THREAD_CLEANUP="false")
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")

    cluster.fake.push_message(CHAT_ID, "one\ntwo\nthree", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "got:three")
    assert "got:one\ngot:two\ngot:three" in "\n".join(cluster.texts_in(thread))

    cluster.fake.push_message(CHAT_ID, "err no such table", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "⚠ error: err no such table")

    cluster.fake.push_message(CHAT_ID, "bye", thread_id=thread, from_id=OWNER_ID)
    assert await follower.wait() == 3
    await cluster.wait_text(thread, "⏹ exited with code 3 after ")
    assert cluster.texts_in(thread)[-1].startswith("⏹ exited with code 3 after ")


async def test_python_repl_on_a_pty(cluster: Cluster, tmp_path):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = tmp_path / "repo-repl"
    work.mkdir()
    follower = await cluster.spawn("follow-repl", ["follow", "--cwd", str(work), "--pty", "--end-blocks", "--",
                                                   sys.executable, "-i", "-q"])
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, ">>>")

    cluster.fake.push_message(CHAT_ID, "def f(x):\n    return x * 2", thread_id=thread, from_id=OWNER_ID)
    cluster.fake.push_message(CHAT_ID, "print('\\x1b[32m%d\\x1b[0m' % f(21))", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "42")
    cluster.fake.push_message(CHAT_ID, "undefined_name", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "NameError")
    shown = "\n".join(cluster.texts_in(thread))
    assert "\x1b" not in shown and "print(" not in shown and "return x" not in shown  # no echo, no escapes

    cluster.fake.push_message(CHAT_ID, "exit()", thread_id=thread, from_id=OWNER_ID)
    assert await follower.wait() == 0
    await cluster.wait_text(thread, "⏹ exited with code 0 after ")
