"""Agent output under Telegram's real budget (docs/operations.md, "The outbound budget"): real leader and ``follow`` processes against
a fake Bot API that enforces 20 calls a minute and one a second for the group, as Telegram does.

Deadlines are derived from that budget (20 a minute, 1 a second), with margin for a busy machine;
exact figures (time to visible, messages per KB, 429s) are measured in ``bench/``."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster, RawBus

pytestmark = pytest.mark.e2e

GROUP_BUDGET = {"TOPICBUS_RATE_LIMIT_PER_CHAT_PER_MINUTE": "20", "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_SECOND": "1"}

# Waits for "go", then prints LINES lines over SECONDS seconds; then stays alive (reads stdin).
FLOOD_AGENT = textwrap.dedent("""
    import os, sys, time
    name = os.path.basename(os.getcwd())
    lines, seconds = int(os.environ["LINES"]), float(os.environ["SECONDS"])
    sys.stdin.readline()
    start = time.monotonic()
    for i in range(lines):
        print(f"{name} line {i:03d} " + "." * 40, flush=True)
        time.sleep(max(0.0, start + (i + 1) * seconds / lines - time.monotonic()))
    for line in sys.stdin:
        pass
""")

# Waits for "go", then prints one line a second for SECONDS seconds, each with its (monotonic) time.
TICKER_AGENT = textwrap.dedent("""
    import os, sys, time
    seconds = int(os.environ["SECONDS"])
    sys.stdin.readline()
    start = time.monotonic()
    for i in range(seconds + 1):
        time.sleep(max(0.0, start + i - time.monotonic()))
        print(f"tick {i:02d} at {time.monotonic():.3f}", flush=True)
    for line in sys.stdin:
        pass
""")


def go(cluster: Cluster, thread: int, text: str = "go") -> float:
    cluster.fake.push_message(CHAT_ID, text, thread_id=thread, from_id=OWNER_ID)
    return time.monotonic()


def output_lines(cluster: Cluster, thread: int, prefix: str) -> list[str]:
    return [line for line in cluster.lines_in(thread) if line.startswith(prefix)]


async def budgeted_leader(cluster: Cluster, **env: str) -> None:
    cluster.fake.set_flood_limit(20, per_second=1)
    await cluster.start_leader(**GROUP_BUDGET, **env)
    await cluster.wait_polling()


async def test_three_agents_flooding_are_all_visible_within_a_minute_and_status_answers_meanwhile(
        cluster: Cluster):
    await budgeted_leader(cluster)
    threads = {}
    for name in ("alpha", "bravo", "charlie"):
        work = cluster.tmp / name
        await cluster.start_follower(work, script=FLOOD_AGENT, LINES="400", SECONDS="8")
        threads[name] = (await cluster.wait_follower_topic(work, timeout=40))["threadId"]
    started = min(go(cluster, thread) for thread in threads.values())

    # While the agents flood, /status in the control topic is answered within 2 s (the reserve).
    def output_calls() -> int:
        return len([c for c in cluster.fake.calls if c.method in ("sendMessage", "editMessageText", "sendDocument")
                    and c.params.get("message_thread_id") in threads.values()])

    # Into the flood: the agents' output has spent most of the minute's allowance (20, 4 of them kept
    # in reserve for answers like this one).
    await cluster.wait_for(lambda: output_calls() >= 12, timeout=30, message="the flood spending the budget")
    snap = await cluster.status()
    control = snap["controlThreadId"]
    answers_before = len(cluster.texts_in(control))
    asked = go(cluster, control, "/status")
    await cluster.wait_for(lambda: len(cluster.texts_in(control)) > answers_before, timeout=10,
                           message="the answer to /status")
    answered = cluster.fake.messages_in(CHAT_ID, control)[answers_before].at
    assert answered - asked < 2.0, f"/status answered after {answered - asked:.2f}s"
    assert "budget" in cluster.texts_in(control)[answers_before]

    expected = {name: [f"{name} line {i:03d} " + "." * 40 for i in range(400)] for name in threads}
    await cluster.wait_for(lambda: all(output_lines(cluster, thread, name) == expected[name]
                                       for name, thread in threads.items()),
                           timeout=60 - (time.monotonic() - started),
                           message=lambda: "all output visible within 60 s: " + ", ".join(
                               f"{n} {len(output_lines(cluster, t, n))}/400" for n, t in threads.items()))
    assert cluster.fake.flood_rejections == 0  # the leader never went past Telegram's allowance
    for name, thread in threads.items():  # coalesced: far fewer calls than the 32 batches each agent wrote
        calls = [c for c in cluster.fake.calls if c.params.get("message_thread_id") == thread
                 and c.method in ("sendMessage", "sendDocument", "editMessageText") and c.status == 200]
        assert len(calls) <= 8, (name, [c.method for c in calls])


async def test_a_slow_stream_grows_one_message_and_each_line_shows_within_5_s(cluster: Cluster):
    await budgeted_leader(cluster)
    work = cluster.tmp / "ticker"
    await cluster.start_follower(work, script=TICKER_AGENT, SECONDS="60")
    thread = (await cluster.wait_follower_topic(work, timeout=40))["threadId"]
    go(cluster, thread)
    await cluster.wait_for(lambda: len(output_lines(cluster, thread, "tick")) == 61, timeout=80,
                           message=lambda: f"61 ticks visible: {len(output_lines(cluster, thread, 'tick'))}")
    messages = [m for m in cluster.fake.messages_in(CHAT_ID, thread) if m.kind == "text"]
    assert len(messages) <= 3, [m.text[:40] for m in messages]
    first_seen: dict[str, float] = {}
    for message in messages:
        for at, text in message.history:
            for line in text.split("\n"):
                if line.startswith("tick"):
                    first_seen.setdefault(line, at)
    late = {line: round(seen - float(line.rsplit(" ", 1)[1]), 2) for line, seen in first_seen.items()
            if seen - float(line.rsplit(" ", 1)[1]) > 5.0}
    calls = [(round(c.at, 2), c.method, c.status) for c in cluster.fake.calls if c.method in (
        "sendMessage", "editMessageText", "createForumTopic", "sendDocument", "editForumTopic")]
    assert not late, (late, calls)
    assert cluster.fake.flood_rejections == 0


async def test_a_backlog_of_2000_items_does_not_hold_up_another_topics_answer(cluster: Cluster):
    await budgeted_leader(cluster, TOPICBUS_OUTBOX_MAX_ITEMS="5000")
    bus = await RawBus.connect(cluster)
    try:
        chatty, _ = await bus.register(str(cluster.tmp / "chatty"))
        for i in range(2000):
            assert (await bus.send_text(chatty, f"backlog {i:04d}", f"b-{i}"))["ok"] is True
        echo = cluster.tmp / "echo"
        await cluster.start_follower(echo)
        thread = (await cluster.wait_follower_topic(echo, timeout=40))["threadId"]
        await cluster.wait_text(thread, "agent ready", timeout=30)
        asked = go(cluster, thread, "ping")
        await cluster.wait_text(thread, "echo: ping", timeout=30)
        answered = next(m.history[-1][0] for m in cluster.fake.messages_in(CHAT_ID, thread)
                        if m.text and "echo: ping" in m.text)
        # Its fair share: topics are served in turn at one call a second, so the answer waits for at
        # most a turn of the chatty topic; the 2,000 items go out as one file, not 2,000 messages.
        assert answered - asked < 5.0, f"answered after {answered - asked:.2f}s"
    finally:
        await bus.close()


async def test_leader_sigkill_mid_stream_loses_nothing_and_repeats_at_most_one_message(cluster: Cluster):
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    work = cluster.tmp / "stream"
    await cluster.start_follower(work, script=FLOOD_AGENT, LINES="300", SECONDS="6")
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    go(cluster, thread)
    await cluster.wait_for(lambda: len(output_lines(cluster, thread, "stream")) >= 50, message="the stream going")
    leader.kill(signal.SIGKILL)
    await leader.wait()
    await cluster.start_leader()
    await cluster.wait_polling()
    expected = [f"stream line {i:03d} " + "." * 40 for i in range(300)]
    await cluster.wait_for(lambda: set(expected) <= set(output_lines(cluster, thread, "stream")), timeout=40,
                           message=lambda: f"every line visible: {len(set(output_lines(cluster, thread, 'stream')))}")
    seen = output_lines(cluster, thread, "stream")
    deduplicated = list(dict.fromkeys(seen))
    assert deduplicated == expected  # nothing lost, in order
    repeated = [line for line in set(seen) if seen.count(line) > 1]
    if repeated:  # a crash may repeat the one message in flight: all repeats come from one message
        holders = [m for m in cluster.fake.messages_in(CHAT_ID, thread)
                   if (m.text or m.document_bytes) and set(repeated) <= set(
                       (m.text or m.document_bytes.decode()).split("\n"))]
        assert holders, f"{len(repeated)} repeated lines, not from one message"


async def test_500_large_documents_keep_the_leader_small_and_another_topic_answering(cluster: Cluster):
    cluster.fake.keep_document_bytes = False
    leader = await cluster.start_leader(TOPICBUS_OUTBOX_MAX_BYTES=str(8 * 1024 * 1024))
    await cluster.wait_polling()
    echo = cluster.tmp / "echo-docs"
    await cluster.start_follower(echo)
    echo_thread = (await cluster.wait_follower_topic(echo))["threadId"]
    await cluster.wait_text(echo_thread, "agent ready")

    from topicbus import FollowerClient

    client = FollowerClient(leader_url=f"ws://127.0.0.1:{cluster.port}/v1/bus", secret=cluster.env()[
        "TOPICBUS_BUS_SECRET"], cwd=str(cluster.tmp / "docs"), name="docs", heartbeat_interval_s=0.2)
    blob = os.urandom(512 * 1024)

    async def pump() -> int:
        sent = 0
        for i in range(500):
            await client.send_document(f"blob-{i:03d}.bin", blob)
            sent += 1
        return sent

    async with client:
        await client.wait_registered(timeout=20)
        pumping = asyncio.create_task(pump())
        try:
            for round_ in range(5):
                await asyncio.sleep(1)
                asked = go(cluster, echo_thread, f"still there {round_}?")
                await cluster.wait_text(echo_thread, f"echo: still there {round_}?", timeout=20)
                answered = next(m.at for m in cluster.fake.messages_in(CHAT_ID, echo_thread)
                                if m.text and f"echo: still there {round_}?" in m.text)
                assert answered - asked < 2.0, f"echo {round_} after {answered - asked:.2f}s"
            assert await asyncio.wait_for(pumping, 300) == 500
        finally:
            pumping.cancel()
    def documents() -> list:
        return [m for m in cluster.fake.sent if m.kind == "document" and (m.document_name or "").startswith("blob-")]

    await cluster.wait_for(lambda: len(documents()) >= 500, timeout=120, message="all 500 documents posted")
    assert len({m.document_name for m in documents()}) == 500 == len(documents())  # each once
    peak_kb = _peak_rss_kb(leader.pid)
    assert peak_kb < 150 * 1024, f"leader RSS peaked at {peak_kb / 1024:.0f} MB"


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")
