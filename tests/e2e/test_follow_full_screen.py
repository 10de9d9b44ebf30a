"""Full-screen programs under ``follow --pty``: one screen message edited in place with the
latest complete frame, not a snapshot message every few seconds. A real leader under Telegram's group
budget (20 calls a minute, one a second, enforced by the fake Bot API), real ``follow --pty`` processes,
a real program on the alternate screen, and another agent answering meanwhile."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster

pytestmark = pytest.mark.e2e

PER_MINUTE, PER_SECOND, RESERVE = 20, 1, 4
GROUP_BUDGET = {"TOPICBUS_RATE_LIMIT_PER_CHAT_PER_MINUTE": str(PER_MINUTE),
                "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_SECOND": str(PER_SECOND)}
# Another topic's answer while a screen is edited: a screen edit leaves room in the window for other
# output, so the answer waits at most for the call on the wire and the per-second spacing; the
# deadline allows the time one output send takes to free in a full window, twice, plus margin for a
# busy machine.
ANSWER_DEADLINE_S = 2 * 60 / (PER_MINUTE - RESERVE) + 5.0
SECONDS = 25

# Enters the alternate screen, redraws a dashboard with a counter every second for SECONDS seconds
# (cursor home, clear, the whole screen), leaves the alternate screen and exits.
DASHBOARD = textwrap.dedent(f"""
    import sys, time
    out = sys.stdout
    out.write("\\x1b[?1049h")
    start = time.monotonic()
    for n in range({SECONDS} + 1):
        time.sleep(max(0.0, start + n - time.monotonic()))
        rows = ["DASHBOARD  host alpha  load 0.42  (the header line)", "", f"counter {{n:02d}}"]
        rows += [f"worker {{i}}: " + "#" * ((n + i) % 30) for i in range(12)]
        out.write("\\x1b[H\\x1b[2J" + "\\r\\n".join(rows))
        out.flush()
    out.write("\\x1b[?1049l")
    out.flush()
""")


async def test_a_full_screen_dashboard_is_one_message_edited_in_place_and_others_still_answer(
        cluster: Cluster):
    cluster.fake.set_flood_limit(PER_MINUTE, per_second=PER_SECOND)
    await cluster.start_leader(**GROUP_BUDGET)
    await cluster.wait_polling()
    echo_work = cluster.tmp / "echo"
    await cluster.start_follower(echo_work)
    echo_thread = (await cluster.wait_follower_topic(echo_work, timeout=40))["threadId"]
    await cluster.wait_text(echo_thread, "agent ready", timeout=40)

    work = cluster.tmp / "dash"
    work.mkdir()
    script = work / "dashboard.py"
    script.write_text(DASHBOARD)
    follower = await cluster.spawn("follow-dash", ["follow", "--cwd", str(work), "--pty", "--",
                                                   sys.executable, str(script)], **GROUP_BUDGET)
    thread = (await cluster.wait_follower_topic(work, timeout=40))["threadId"]
    await cluster.wait_text(thread, "counter 0", timeout=40)

    # While the screen is edited, the other agent answers within the budget's deadline, twice.
    for n in range(2):
        cluster.fake.push_message(CHAT_ID, f"ping {n}", thread_id=echo_thread, from_id=OWNER_ID)
        asked = time.monotonic()
        await cluster.wait_text(echo_thread, f"echo: ping {n}", timeout=ANSWER_DEADLINE_S)
        assert time.monotonic() - asked < ANSWER_DEADLINE_S
        await cluster.wait_for(lambda k=n: max(map(_counter, cluster.texts_in(thread))) >= 8 * (k + 1),
                               timeout=40)

    assert await follower.wait(timeout=60) == 0
    await cluster.wait_text(thread, "⏹ exited with code 0", timeout=60)

    sends = [c for c in cluster.fake.calls_to("sendMessage")
             if c.params.get("message_thread_id") == thread and c.status == 200
             and not str(c.params.get("text", "")).startswith("⏹")]
    notifying = [c for c in sends if not c.params.get("disable_notification")]
    assert len(sends) <= 3, [c.params.get("text", "")[:60] for c in sends]
    assert len(notifying) <= 1
    edits = [c for c in cluster.fake.calls_to("editMessageText") if c.status == 200]
    assert edits, "the screen message was never edited"
    screens = [t for t in cluster.texts_in(thread) if "DASHBOARD" in t]
    assert screens
    last = screens[-1].splitlines()
    assert last[0].startswith("DASHBOARD  host alpha")  # the whole screen, header line included
    assert f"counter {SECONDS:02d}" in last  # the final screen stays


def _counter(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("counter "):
            return int(line.split()[1])
    return -1
