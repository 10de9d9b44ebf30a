"""`topicbus follow` end to end: a real leader against the fake Bot API, real follow processes, real
programs (a Python script, Python's REPL on a pty): what the topic shows."""

from __future__ import annotations

import signal
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


TICKER_THAT_ANSWERS = textwrap.dedent("""
    import sys, threading, time
    def tick():
        for n in range(200):
            print(f"tick {n}", flush=True)
            time.sleep(0.5)
    threading.Thread(target=tick, daemon=True).start()
    for line in sys.stdin:
        print("got:" + line.rstrip(), flush=True)
""")


async def test_an_answer_after_the_owner_spoke_is_a_new_message_below_never_an_edit_above(cluster: Cluster,
                                                                                         tmp_path):
    # Telegram's real budget: a steady stream grows one live message by edits.
    budget = {"TOPICBUS_RATE_LIMIT_PER_CHAT_PER_MINUTE": "20", "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_SECOND": "1"}
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false", **budget)
    await cluster.wait_polling()
    work = tmp_path / "ticker"
    await cluster.start_follower(work, script=TICKER_THAT_ANSWERS, TOPICBUS_THREAD_CLEANUP="false")
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_for(lambda: any(m.edits for m in cluster.fake.messages_in(CHAT_ID, thread)), timeout=30,
                           message="the ticker's message growing by edits")

    asked = cluster.fake.push_message(CHAT_ID, "hello", thread_id=thread, from_id=OWNER_ID)["message"]["message_id"]
    await cluster.wait_text(thread, "got:hello", timeout=30)
    [answer] = [m for m in cluster.fake.messages_in(CHAT_ID, thread) if "got:hello" in (m.text or "")]
    assert answer.message_id > asked  # below the question on the phone
    assert not any("got:hello" in text for m in cluster.fake.messages_in(CHAT_ID, thread)
                   if m.message_id < asked for _, text in m.history)  # no earlier message grew to hold it


# Block-buffered (no -u, no flush): prints colours and a carriage-return progress bar when asked,
# traps SIGINT for /interrupt, and answers each line it reads.
TERMINAL_AGENT = textwrap.dedent("""
    import signal, sys, time
    def interrupted(*_):
        print("interrupted")
        sys.stdout.flush()
    signal.signal(signal.SIGINT, interrupted)
    print("\\x1b[1;32mREADY\\x1b[0m")
    for line in sys.stdin:
        line = line.rstrip("\\n")
        if line == "bar":
            for i in range(0, 101, 10):
                sys.stdout.write("\\r[" + "#" * (i // 10) + " " * (10 - i // 10) + f"] {i}%")
                time.sleep(0.02)
            print()
        elif line == "busy":
            print("working")
            while True:
                time.sleep(0.05)
        else:
            print("got:" + line)
""")


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_interrupt_colours_and_progress_through_the_leader(cluster: Cluster, tmp_path, pty: bool):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = tmp_path / ("term-pty" if pty else "term-pipe")
    work.mkdir()
    env = {"PYTHONUNBUFFERED": ""}  # block-buffered unless a terminal makes Python line-buffer
    command = [sys.executable, "-c", TERMINAL_AGENT]
    if not pty:
        command.insert(1, "-u")  # a pipe needs -u; the pty does without it (the point of --pty)
    await cluster.spawn(f"follow-{work.name}", ["follow", "--cwd", str(work), *(["--pty"] if pty else []), "--",
                                                *command], **env)
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "READY")

    cluster.fake.push_message(CHAT_ID, "hello", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "got:hello", timeout=2)  # each message answered at once, even block-buffered
    cluster.fake.push_message(CHAT_ID, "bar", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "100%")
    cluster.fake.push_message(CHAT_ID, "busy", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "working")
    cluster.fake.push_message(CHAT_ID, "/interrupt", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "interrupted", timeout=3)

    shown = "\n".join(cluster.fake.visible_lines(CHAT_ID, thread))
    assert "READY" in shown and not any(ch in shown for ch in "\x1b\r\b")
    assert [line.strip() for line in shown.splitlines() if "%" in line] == ["[##########] 100%"]


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_interrupt_works_although_follow_was_started_with_sigint_ignored(cluster: Cluster, tmp_path,
                                                                                 pty: bool):
    # A script, `nohup` or `( … & )` starts follow with SIGINT ignored; bash keeps for its children
    # what it found ignored. The child must start with the terminal's signals at their defaults.
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = tmp_path / ("ignint-pty" if pty else "ignint-pipe")
    work.mkdir()
    shell = ["bash", "--norc", "--noprofile", *(["-i"] if pty else [])]
    await cluster.spawn(f"follow-{work.name}", ["follow", "--cwd", str(work), *(["--pty"] if pty else []), "--",
                                                *shell], ignored_signals=(signal.SIGINT, signal.SIGQUIT))
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    cluster.fake.push_message(CHAT_ID, "echo started-$((6*7)); sleep 120; echo slept-$((6*7))",
                              thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "started-42")
    cluster.fake.push_message(CHAT_ID, "/interrupt", thread_id=thread, from_id=OWNER_ID)
    if pty:  # an interactive shell survives Ctrl-C and takes the next command at once
        cluster.fake.push_message(CHAT_ID, "echo after-$((6*7))", thread_id=thread, from_id=OWNER_ID)
        await cluster.wait_text(thread, "after-42", timeout=30)
    else:  # a shell script dies with its interrupted command, as it does on a terminal
        await cluster.wait_text(thread, "⏹ killed by SIGINT", timeout=30)
    assert not any("slept-42" in text for text in cluster.texts_in(thread))


async def test_a_program_that_ends_by_itself_ends_its_topic_with_one_notifying_notice(cluster: Cluster, tmp_path):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = tmp_path / "job"
    script = "import time\nfor i in range(3):\n    print(f'step {i}', flush=True)\n    time.sleep(0.3)\n"
    follower = await cluster.start_follower(work, script=script, TOPICBUS_THREAD_CLEANUP="false")
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    assert await follower.wait() == 0
    await cluster.wait_text(thread, "⏹ exited with code 0 after ")
    # The stream's last words (here: the exit notice, right after the output) notify by themselves:
    # no silent message followed by a "✓ ⏹ exited …" line that repeats it.
    [notice] = [m for m in cluster.fake.messages_in(CHAT_ID, thread) if (m.text or "").startswith("⏹ exited")]
    assert notice.silent is False
    assert "step 2" in "\n".join(cluster.texts_in(thread))
